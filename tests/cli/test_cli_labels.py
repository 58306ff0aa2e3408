"""Labels that say what happened (issue 44, items 7 and 8): ``--version``, one set of table formats on every table
verb, an unknown method reported once, task errors naming the task source, and ``run``'s help naming the quick
job's values (fast: a local SQLite database, no worker, no container)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from db import connect, sqlite_url
from jobs.job_file import QUICK_JOB_FILE, JobSpecError
from jobs.spec import JobSpec
from jobs.submit import load_job_tasks, plan_episodes
from results.table_formats import TABLE_FORMATS
from tests.cli.test_cli import _finished_job, invoke
from tests.support.worker_fixtures import oracle_job, write_job


@pytest.fixture
def db(tmp_path):
    return connect(sqlite_url(tmp_path / "nexus-eval.db"))


def test_version_flag_prints_what_the_verb_prints():
    flag, verb = invoke("--version"), invoke("version")
    assert flag.exit_code == 0 and verb.exit_code == 0, (flag.output, verb.output)
    assert flag.stdout == verb.stdout and flag.stdout.strip()
    assert "--version" in invoke("--help").stdout


def test_episodes_and_compare_take_the_same_table_formats(db):
    job_id, ids = _finished_job(db)
    assert set(TABLE_FORMATS) >= {"table", "csv", "tsv", "json"}
    for fmt in TABLE_FORMATS:
        for verb in ("episodes", "compare"):
            done = invoke(verb, job_id, "--format", fmt, "--db", db.url)
            assert done.exit_code == 0, (verb, fmt, done.output)
    for verb in ("episodes", "compare"):
        done = invoke(verb, job_id, "--format", "yaml", "--db", db.url)
        assert done.exit_code == 2 and ", ".join(TABLE_FORMATS) in done.output, done.output

    def read(verb: str, fmt: str) -> list[list[str]]:
        text = invoke(verb, job_id, "--format", fmt, "--db", db.url).stdout
        return list(csv.reader(io.StringIO(text), delimiter="\t" if fmt == "tsv" else ","))

    for verb in ("episodes", "compare"):  # tsv is csv with a tab: the same rows and fields
        assert read(verb, "tsv") == read(verb, "csv") and len(read(verb, "csv")) > 1, verb
    listed = json.loads(invoke("episodes", job_id, "--format", "json", "--db", db.url).stdout)
    header, *rows = read("episodes", "csv")
    assert [dict(zip(header, r, strict=True))["episode"] for r in rows] == [e["episode"] for e in listed]
    assert sorted(e["episode"] for e in listed) == sorted(ids)
    markdown = invoke("episodes", job_id, "--format", "markdown", "--db", db.url).stdout.splitlines()
    assert markdown[0].startswith("| episode | task |") and len(markdown) == 2 + len(ids)


@pytest.mark.parametrize("methods", [["dense", "snapkvv"], ["snapkvv"]])
def test_an_unknown_method_is_reported_once_on_methods(methods):
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({"methods": methods})
    assert [field for field, _ in caught.value.errors] == [f"methods.{methods.index('snapkvv')}"]
    assert "method_params" not in str(caught.value)
    # a method_params entry the user did write for it is still reported
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({"methods": methods, "method_params": {"snapkvv": {}}})
    assert "method_params.snapkvv" in [field for field, _ in caught.value.errors]


def test_an_unknown_method_flag_or_job_file_entry_names_only_the_method(db, tmp_path):
    done = invoke("submit", "--backend", "oracle", "--methods", "dense,snapkvv", "--db", db.url)
    assert done.exit_code == 2 and "unknown method 'snapkvv'" in done.output
    assert "method_params" not in done.output, done.output
    job = write_job(tmp_path / "job.yaml", **oracle_job(["humanfmt__humanfmt-1"], ["typo"], ["true_eviction"]))
    done = invoke("submit", "--file", str(job), "--db", db.url)
    assert done.exit_code == 2 and "unknown method 'typo'" in done.output
    assert "method_params" not in done.output, done.output


def _selection_error(tasks: dict) -> str:
    spec = JobSpec.from_dict({"backend": "oracle", "tasks": tasks})
    with pytest.raises(JobSpecError) as caught:
        plan_episodes(spec, load_job_tasks(spec))
    return str(caught.value)


def test_a_task_selection_error_names_the_task_file_or_suite(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    for tasks, named in (
        ({"suite": "mini", "ids": ["no_such_task-1"]}, "suite 'mini'"),
        ({"suite": "no_such_suite"}, "suite 'no_such_suite'"),
        ({"file": str(missing)}, f"task file {missing}"),
    ):
        message = _selection_error(tasks)
        assert message.startswith(f"{named}: field 'tasks"), message
        assert "<task selection>" not in message


def test_run_help_names_the_quick_job_values_and_submit_the_job_defaults():
    quick, defaults = JobSpec.load(QUICK_JOB_FILE), JobSpec()
    assert quick.limits.max_steps != defaults.limits.max_steps  # what makes the two helps differ

    def help_of(verb: str) -> str:
        return " ".join(invoke(verb, "--help").stdout.replace("│", " ").split())

    run, submit = help_of("run"), help_of("submit")
    assert f"absolute turn limit (quick job: {quick.limits.max_steps};" in run
    assert f"else {defaults.limits.max_steps})" in run
    assert f"absolute turn limit (job default: {defaults.limits.max_steps})" in submit
    assert f"job default: {defaults.limits.max_steps})" not in run
    assert f"(job default: {defaults.density})" in run  # a value the quick job leaves alone: the job default
