"""What a job reports is what its agent did (issue 21): interactive attempts kept apart from the results, exports
the official harness reads as meant, the first failure's reason kept, and the verbs that list and show episodes.

Rows are written through the real claim/record_turn/finish/grade API on SQLite, the way a worker and an
interactive rerun write them; the exported files are read back with swebench's own prediction loading."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from db import connect, sqlite_url
from db import store as db_store
from db.models import Episode, Turn
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from results.compare import compare_jobs
from tests.cli.test_cli import PATCH, invoke, read_cli
from tests.support.worker_fixtures import oracle_job
from workers.grade_stored import regrade_job

TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1"]
STEERED_PATCH = PATCH.replace("+b", "+steered")
TWO_FILES = PATCH + "diff --git a/repro.py b/repro.py\n--- /dev/null\n+++ b/repro.py\n@@ -0,0 +1 @@\n+print(1)\n"


def _run(db, episode_id, status, *, patch=PATCH, intervened=False, action=None, completion="<think>x</think>"):
    """One attempt through the claim API: a turn, the agent's exit, then the grade (``status``)."""
    with db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    with db.session() as s:
        db_store.record_turn(
            s,
            claim,
            0,
            completion=completion,
            action=action,
            observation="[bold]not markup[/bold]",
            extra={"intervened": True} if intervened else {},
            steered=intervened,
        )
    with db.session() as s:
        db_store.finish_episode(s, claim, "submitted", patch=patch)
    with db.session() as s:
        db_store.record_grade(s, episode_id, status, test_log="log", grader="test")


def _job(db, methods, protocols=("true_eviction",)):
    spec = JobSpec.from_dict(oracle_job(TASKS, list(methods), list(protocols)))
    job_id, ids = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    with db.session() as s:
        rows = {(r.task_id, r.method, r.protocol): r.id for r in db_store.episodes_for_job(s, job_id)}
    assert len(rows) == len(ids)
    return job_id, rows


def _interactive(db, source_id, status, *, steer):
    with db.session() as s:
        new_id = db_store.new_attempt(s, source_id, driver="interactive").id
    _run(db, new_id, status, patch=STEERED_PATCH, intervened=steer)
    return new_id


@pytest.fixture
def db(tmp_path):
    return connect(sqlite_url(tmp_path / "nexus-eval.db"))


@pytest.fixture
def steered_job(db):
    """dense resolves both tasks, nexus neither; then an operator steers nexus to resolve task 0, and a
    second interactive rerun (every action the model's) resolves task 1."""
    job_id, rows = _job(db, ["dense", "nexus"])
    for (_task, method, _), episode_id in rows.items():
        _run(db, episode_id, "resolved" if method == "dense" else "unresolved")
    steered = _interactive(db, rows[(TASKS[0], "nexus", "true_eviction")], "resolved", steer=True)
    replayed = _interactive(db, rows[(TASKS[1], "nexus", "true_eviction")], "resolved", steer=False)
    return db, job_id, rows, steered, replayed


def test_an_operator_changing_an_action_marks_the_attempt_steered(steered_job):
    db, _job_id, rows, steered, replayed = steered_job
    with db.session() as s:
        drivers = {r.id: r.driver for r in s.query(Episode)}
    assert (drivers[steered], drivers[replayed]) == ("steered", "interactive")
    assert {drivers[i] for i in rows.values()} == {"agent"}


def test_compare_counts_the_agents_own_attempts_and_names_the_others(steered_job):
    db, job_id, rows, steered, replayed = steered_job
    with db.session() as s:
        table = compare_jobs(s, [job_id])
        counted = compare_jobs(s, [job_id], include_interactive=True)
    nexus = table.rows[0].cells["nexus"]
    assert (nexus.resolved, nexus.n, nexus.interactive) == (0, 2, 0)  # before: 2/2, the operator's
    assert any("2 interactive attempt(s) (1 steered" in note for note in table.notes), table.notes
    both = counted.rows[0].cells["nexus"]
    assert (both.resolved, both.n, both.interactive) == (2, 2, 2)
    assert counted.drivers[("prefill_only", "true_eviction", 0.2, "nexus")][TASKS[0]] == ["steered"]
    assert any("marked *" in note and "1 steered" in note for note in counted.notes), counted.notes

    shown = json.loads(read_cli("compare", job_id, "--format", "json", db=db))
    assert shown["rows"][0]["cells"]["nexus"]["resolved"] == 0
    shown = json.loads(read_cli("compare", job_id, "--format", "json", "--include-interactive", db=db))
    assert (shown["rows"][0]["cells"]["nexus"]["resolved"], shown["rows"][0]["cells"]["nexus"]["interactive"]) == (2, 2)
    assert "✓*" in read_cli("compare", job_id, "--format", "markdown", "--include-interactive", db=db)


def test_export_regrade_and_rerun_take_the_agents_attempt(steered_job):
    db, job_id, rows, steered, replayed = steered_job
    lines = [json.loads(x) for x in read_cli("export", job_id, "--method", "nexus", db=db).splitlines()]
    assert {x["model_patch"] for x in lines} == {PATCH}
    lines = read_cli("export", job_id, "--method", "nexus", "--include-interactive", db=db).splitlines()
    assert {json.loads(x)["model_patch"] for x in lines} == {STEERED_PATCH}
    regraded = {episode_id for episode_id, _, _ in regrade_job(db, job_id)}
    assert regraded == set(rows.values())
    with db.session() as s:
        # the regrade of the test's fake log made every result an infra_failure; the interactive ones are untouched
        assert {r.status for r in db_store.interactive_attempts(s, [job_id])} == {"resolved"}
        again = db_store.rerun_job(s, job_id, ["infra_failure"])
        assert sorted(r.attempt for r in again) == [2, 2, 3, 3] and {r.driver for r in again} == {"agent"}


def test_dashboard_and_report_keep_interactive_attempts_apart(steered_job, tmp_path):
    from fastapi.testclient import TestClient

    from dashboard.app import create_app
    from dashboard.report import write_report

    db, job_id, rows, steered, replayed = steered_job
    client = TestClient(create_app(db.url, token="t" * 16, public=False, allowed_hosts=["testserver"]))
    page = client.get(f"/jobs/{job_id}").text
    listed, interactive = page.split('id="interactive"')
    assert steered not in listed and f'data-episode="{steered}" data-driver="steered"' in interactive
    assert 'data-driver="steered"' not in client.get(f"/jobs/{job_id}/compare").text
    counted = client.get(f"/jobs/{job_id}/compare?include_interactive=1").text
    assert f'href="/episodes/{steered}" data-status="resolved" data-driver="steered"' in counted
    assert json.loads(client.get(f"/jobs/{job_id}/compare.json").text)["rows"][0]["cells"]["nexus"]["resolved"] == 0
    assert 'id="driver"' in client.get(f"/episodes/{steered}").text
    report = write_report(db.url, job_id, tmp_path / "r.html").read_text()
    assert 'data-driver="steered"' not in report and "2 interactive attempt(s)" in report
    report = write_report(db.url, job_id, tmp_path / "r2.html", include_interactive=True).read_text()
    assert 'data-driver="steered"' in report


def test_episodes_lists_every_attempt_with_its_driver(steered_job):
    db, job_id, rows, steered, replayed = steered_job
    listed = json.loads(read_cli("episodes", job_id, "--format", "json", db=db))
    assert len(listed) == 6
    by_id = {row["episode"]: row for row in listed}
    assert (by_id[steered]["driver"], by_id[steered]["result"], by_id[steered]["attempt"]) == ("steered", False, 2)
    assert all(by_id[i]["result"] for i in rows.values())
    tsv = read_cli("episodes", job_id, "--status", "resolved", "--method", "nexus", db=db).splitlines()
    assert tsv[0].split("\t")[0] == "episode" and {line.split("\t")[0] for line in tsv[1:]} == {steered, replayed}
    assert invoke("episodes", job_id, "--format", "xml", "--db", db.url).exit_code == 2
    assert invoke("episodes", "nosuchjob", "--db", db.url).exit_code == 2


def test_inspect_renders_its_labels_and_shows_the_raw_completion_of_a_format_error(db):
    job_id, rows = _job(db, ["dense"])
    episode_id = next(iter(rows.values()))
    _run(db, episode_id, "unresolved", completion="I think [b]this[/b] <function=broken", action=None)
    shown = read_cli("inspect", episode_id, "--full", db=db)
    assert "[bold]" not in shown.replace("[bold]not markup[/bold]", "")  # labels rendered, stored text verbatim
    assert "[bold]not markup[/bold]" in shown
    assert "raw completion (no valid function call)" in shown and "I think [b]this[/b] <function=broken" in shown


def test_a_grade_adds_its_reason_after_the_agent_stages_and_a_regrade_replaces_only_its_own(db):
    job_id, rows = _job(db, ["dense"])
    episode_id = next(iter(rows.values()))
    with db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    with db.session() as s:
        db_store.finish_episode(
            s, claim, "step_limit", exit_status="step_limit", patch=None, error="the engine went away mid-episode"
        )
    with db.session() as s:
        db_store.record_grade(s, episode_id, "infra_failure", error="grading failed: the agent stage left no patch")
    with db.session() as s:
        error = db_store.get_episode(s, episode_id).error
    assert error.splitlines() == ["the engine went away mid-episode", "grading failed: the agent stage left no patch"]
    with db.session() as s:
        db_store.record_grade(s, episode_id, "infra_failure", error="still no patch", regrade=True)
    with db.session() as s:
        assert db_store.get_episode(s, episode_id).error.splitlines() == [
            "the engine went away mid-episode",
            "still no patch",
        ]


# ------------------------------------------------------------------------------------------------ export


def _multi_config_job(db):
    """dense (one cell) + nexus and snapkv under two protocols: 5 configurations x 2 tasks; one nexus patch is
    empty, one snapkv episode left none."""
    job_id, rows = _job(db, ["dense", "nexus", "snapkv"], ["true_eviction", "full_context"])
    patches = {}
    for (task, method, protocol), episode_id in rows.items():
        patch = PATCH.replace("+b", f"+{method}-{protocol}-{task}")
        if (task, method, protocol) == (TASKS[0], "nexus", "full_context"):
            patch = "  \n"
        if (task, method, protocol) == (TASKS[1], "snapkv", "true_eviction"):
            patch = None
        _run(db, episode_id, "unresolved", patch=patch)
        patches[(task, method, protocol)] = patch
    return job_id, patches


def test_export_writes_one_file_per_configuration_that_swebench_reads_whole(db, tmp_path):
    from swebench.harness.utils import get_predictions_from_file

    job_id, patches = _multi_config_job(db)
    refused = invoke("export", job_id, "--db", db.url)
    assert refused.exit_code == 2 and "5 configurations" in refused.output and "--output-dir" in refused.output
    assert invoke("export", job_id, "-o", str(tmp_path / "all.jsonl"), "--db", db.url).exit_code == 2
    assert not (tmp_path / "all.jsonl").exists()

    out = tmp_path / "predictions"
    done = invoke("export", job_id, "--output-dir", str(out), "--db", db.url)
    assert done.exit_code == 0, done.output
    assert "left out 1 (empty patch)" in done.output and "left out 1 (no patch" in done.output
    files = sorted(out.glob("*.jsonl"))
    assert len(files) == 5
    survived = {}
    for path in files:
        # what swebench's run_evaluation does with a predictions file: load it, then key it by instance_id
        predictions = get_predictions_from_file(str(path), "SWE-bench/SWE-bench_Lite", "test")
        keyed = {p["instance_id"]: p for p in predictions}
        assert len(keyed) == len(predictions)  # nothing is dropped by the keying
        names = {p["model_name_or_path"] for p in predictions}
        assert len(names) == 1 and path.name == names.pop().replace("/", "_") + ".jsonl"
        for instance, p in keyed.items():
            method, scope, protocol, seed = p["model_name_or_path"].split("__")[1:]
            survived[(instance, method, protocol)] = p["model_patch"]
    wanted = {key: patch for key, patch in patches.items() if patch and patch.strip()}
    assert survived == wanted


def test_export_picks_one_configuration_and_applies_r2e_gyms_filter(db):
    job_id, rows = _job(db, ["nexus"])
    edit = {"name": "file_editor", "arguments": {"command": "str_replace", "path": "/testbed/x.py"}}
    for episode_id in rows.values():
        _run(db, episode_id, "unresolved", patch=TWO_FILES, action=edit)
    whole = [json.loads(x) for x in read_cli("export", job_id, db=db).splitlines()]
    assert {p["model_patch"] for p in whole} == {TWO_FILES}
    filtered = [json.loads(x) for x in read_cli("export", job_id, "--r2e-filter", db=db).splitlines()]
    assert {p["model_patch"] for p in filtered} == {PATCH}  # repro.py was never str_replace-edited
    assert len(filtered) == 2
    picked = read_cli("export", job_id, "--method", "nexus", "--seed", "0", "--model-name", "mine", db=db)
    assert {json.loads(x)["model_name_or_path"] for x in picked.splitlines()} == {"mine"}
    nothing = invoke("export", job_id, "--method", "snapkv", "--db", db.url)
    assert nothing.exit_code == 2 and "nothing to export" in nothing.output


def test_migration_marks_stored_attempts_with_an_edited_turn_as_steered(db):
    """Revision 0005 on a database written before it: an attempt with an ``intervened`` turn becomes steered,
    every other row agent."""
    from alembic import command

    from db.connection import _alembic_config

    job_id, rows = _job(db, ["dense"])
    edited, plain = rows.values()
    _run(db, edited, "resolved", intervened=True)
    _run(db, plain, "resolved")
    command.downgrade(_alembic_config(db.url), "0004")
    with db.engine.connect() as conn:
        assert "driver" not in {c["name"] for c in sa.inspect(conn).get_columns("episodes")}
    command.upgrade(_alembic_config(db.url), "head")
    with db.session() as s:
        assert {r.id: r.driver for r in s.query(Episode)} == {edited: "steered", plain: "agent"}
        # no table was rebuilt: on SQLite a rebuild's DROP TABLE would have cascaded to every turn
        assert s.query(Turn).count() == 2
    with pytest.raises(sa.exc.IntegrityError), db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE episodes SET driver = 'robot'"))
