"""A replay under settings other than its job's own (``replay --method-params``) is a variant: labelled, never merged.

``jobs.variants`` names a row whose eviction settings differ from its job's resolved settings for the method
``method[key=value,...]``; the replay table and the action table of ``compare`` key and print their cells by that
label, so ``nexus`` with ``head_scores: per_head`` is never counted in (or printed as) the default ``nexus``.
The replays run on the tiny random Qwen3 of ``test_replay`` (its ``host`` fixture and job); the action-table rows
are hand-made as in ``test_action_table``.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from pydantic import TypeAdapter
from sqlalchemy import select

from db import job_rows
from db import store as st
from db.measure_models import Replay
from db.models import Job
from db.replays import record_replay
from jobs.spec import JobSpec
from jobs.variants import job_spec_for, order_labels, variant_label
from measure.replay import plan_replays, replay_job
from nexus.config import EvictionConfig
from results.compare import compare_jobs
from results.compare_render import render
from tests.measure.test_replay import JOB, TASKS, host, make_job, run_stream  # noqa: F401  (host: a fixture)
from tests.results.test_action_table import MODEL, expert_job, score, span
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)

PER_HEAD = {"nexus": {"head_scores": "per_head"}}
VARIANT = "nexus[head_scores=per_head]"
SCOPE, PROTOCOL = "prefill_decode", "true_eviction"
_EVICTION = TypeAdapter(EvictionConfig)


def streamed_job(db) -> tuple[str, dict[str, str]]:
    """JOB over TASKS; its dense episodes finished with a short made-up token stream (enough to plan, no model)."""
    spec = JobSpec.from_dict(JOB)
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        dense = {r.task_id: r.id for r in job_rows.add_episodes(s, job.id, spec.episodes(TASKS)) if r.method == "dense"}
    for episode_id in dense.values():
        run_stream(db, episode_id, [{"keep": 0, "append": [11, 12, 13], "generated": [14, 15]}])
    return job.id, dense


def test_the_label_names_the_settings_that_differ_and_nothing_else():
    job = JobSpec.from_dict(JOB).model_dump(mode="json")
    own = _EVICTION.dump_python(JobSpec.from_dict(JOB).eviction_config("nexus", SCOPE, 0), mode="json")
    assert variant_label(job, "nexus", own) == "nexus"
    # density, scope and seed are cells (or samples) of their own, never a variant
    assert variant_label(job, "nexus", {**own, "density": 0.5, "scope": "prefill_only", "seed": 7}) == "nexus"
    params = {**own["method_params"], "lam": 0.25, "head_scores": "per_head"}
    assert variant_label(job, "nexus", {**own, "method_params": params}) == "nexus[head_scores=per_head,lam=0.25]"
    assert variant_label(job, "nexus", {**own, "window": 32}) == "nexus[window=32]"
    assert variant_label(job, "nexus", {**own, "budget_tokens": 512}) == "nexus[budget_tokens=512]"
    # a method the job did not run is compared with its preset's settings
    h2o = _EVICTION.dump_python(job_spec_for(job, ["h2o"]).eviction_config("h2o", SCOPE, 0), mode="json")
    assert variant_label(job, "h2o", h2o) == "h2o"
    assert variant_label(job, "h2o", {**h2o, "slack_blocks": 0}) == "h2o[slack_blocks=0]"
    assert order_labels([VARIANT, "snapkv", "nexus", "dense", "nexus[a=1]"]) == [
        "dense",
        "snapkv",
        "nexus",
        "nexus[a=1]",
        VARIANT,
    ]


def test_plan_with_method_params_overrides_this_replay_only(sqlite_db):
    job_id, dense = streamed_job(sqlite_db)
    plan = plan_replays(sqlite_db, job_id, protocols=["full_context"], method_params=PER_HEAD)
    by_method = {}
    for item in plan.items:
        by_method.setdefault(item.method, []).append(item.eviction)
    assert sorted(by_method) == ["dense", "nexus", "snapkv"] and len(by_method["nexus"]) == len(TASKS)
    assert all(e["method_params"]["head_scores"] == "per_head" for e in by_method["nexus"])
    assert all(e["method_params"]["walk_steps"] == 3 for e in by_method["nexus"])  # the rest: the job's own
    spec = JobSpec.from_dict(JOB)
    for method in ("snapkv", "dense"):  # the other methods keep the job's settings
        own = _EVICTION.dump_python(spec.eviction_config(method, SCOPE, 0), mode="json")
        assert all(e["method_params"] == own["method_params"] for e in by_method[method])
    with sqlite_db.session() as s:  # the stored job is not changed
        assert s.get(Job, job_id).config == spec.model_dump(mode="json")
    default = plan_replays(sqlite_db, job_id, protocols=["full_context"])
    assert {i.eviction["method_params"]["head_scores"] for i in default.items if i.method == "nexus"} == {"averaged"}


def test_a_bad_override_fails_in_the_plan_before_any_model_loads(sqlite_db, monkeypatch):
    import agent_runner.loaded_models

    def no_model(spec):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(agent_runner.loaded_models, "host_for", no_model)
    job_id, _ = streamed_job(sqlite_db)
    with pytest.raises(ValueError, match=r"nexus: unknown setting\(s\) \['bogus'\]"):
        replay_job(sqlite_db, job_id, method_params={"nexus": {"bogus": 1}})
    with pytest.raises(ValueError, match=r"method_params\.nexus\.head_scores.*'sideways'"):
        replay_job(sqlite_db, job_id, method_params={"nexus": {"head_scores": "sideways"}})
    with pytest.raises(ValueError, match="'nexus' is not replayed"):
        plan_replays(sqlite_db, job_id, methods=["snapkv"], method_params=PER_HEAD)
    with pytest.raises(ValueError, match="dense keeps every token"):
        plan_replays(sqlite_db, job_id, method_params={"dense": {"window": 8}})
    with sqlite_db.session() as s:
        assert list(s.execute(select(Replay)).scalars()) == []

    from typer.testing import CliRunner

    from nexus_eval.cli import app

    args = ["replay", job_id, "--method-params", '{"nexus": {"bogus": 1}}', "--db", sqlite_db.url]
    bad = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert bad.exit_code == 2 and "unknown setting(s) ['bogus']" in bad.output


def test_the_cli_reads_method_params_as_json_or_a_file(tmp_path):
    from nexus_eval.commands.replay import _method_params

    path = tmp_path / "per_head.yaml"
    path.write_text("nexus: {head_scores: per_head}\n", encoding="utf-8")
    assert _method_params(str(path)) == _method_params(json.dumps(PER_HEAD)) == PER_HEAD


def test_a_variant_replay_gets_cells_of_its_own_in_compare(sqlite_db, host, monkeypatch):  # noqa: F811
    from typer.testing import CliRunner

    import agent_runner.loaded_models
    from nexus_eval.cli import app

    job_id, _ = make_job(sqlite_db, host.model)
    replay_job(sqlite_db, job_id, methods=["nexus"], protocols=["full_context"], host=host)
    monkeypatch.setattr(agent_runner.loaded_models, "host_for", lambda spec: host)
    args = ["replay", job_id, "--methods", "nexus", "--protocols", "full_context", "--dtype", "float32"]
    args += ["--db", sqlite_db.url]
    result = CliRunner().invoke(app, [*args, "--method-params", json.dumps(PER_HEAD)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "2 ok" in result.output  # the dense baseline exists: only the variant ran
    assert VARIANT in result.output  # its own line of the closing table, the label printed whole
    with sqlite_db.session() as s:
        rows = [r for r in s.execute(select(Replay)).scalars() if r.method == "nexus"]
    assert sorted(r.config["method_params"]["head_scores"] for r in rows) == ["averaged"] * 2 + ["per_head"] * 2

    with sqlite_db.session() as s:
        table = compare_jobs(s, [job_id])
    cells = {c.method: c for c in table.replay}
    assert list(cells) == ["dense", "nexus", VARIANT]  # the variant right after its method
    for label in ("nexus", VARIANT):  # two episodes each, each paired with the plain dense replay
        assert (cells[label].episodes, cells[label].n_pairs, cells[label].pair_tasks) == (2, 2, 2)
        assert cells[label].delta_nll is not None
    text = render(table, "markdown")
    assert f"| {VARIANT} |" in text and "| nexus |" in text
    assert VARIANT in render(table, "table", width=200)
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert [line["replay_pairs"] for line in lines if line["method"] == VARIANT] == ["2"]
    assert {c["method"] for c in json.loads(render(table, "json"))["replay"]} == {"dense", "nexus", VARIANT}


def _config(job_id: str, db, method: str, **changes) -> dict:
    """``method``'s EvictionConfig in ``job_id`` (a method it did not run: its preset's) with ``changes`` to its
    shared fields or (``params``) its method_params."""
    with db.session() as s:
        config = s.get(Job, job_id).config
    own = _EVICTION.dump_python(job_spec_for(config, [method]).eviction_config(method, SCOPE, 0), mode="json")
    params = {**own["method_params"], **changes.pop("params", {})}
    return {**own, **changes, "method_params": params}


def _replay(db, episode_id: str, method: str, config: dict, spans) -> None:
    with db.session() as s:
        source = st.get_episode(s, episode_id)
        record_replay(s, source, method=method, scope=SCOPE, protocol=PROTOCOL, status="ok", model=MODEL,
                      config=config, score=score(spans))  # fmt: skip


def test_the_action_table_keeps_a_variant_apart_and_tests_it_against_plain_dense_and_snapkv(sqlite_db):
    job, ids = expert_job(sqlite_db, [f"t{i}" for i in range(5)])
    nexus, snapkv = _config(job, sqlite_db, "nexus"), _config(job, sqlite_db, "snapkv")
    per_head = _config(job, sqlite_db, "nexus", params={"head_scores": "per_head"})
    wide = _config(job, sqlite_db, "snapkv", window=32)
    for episode in ids.values():
        _replay(sqlite_db, episode, "dense", _config(job, sqlite_db, "dense"), [span(1.0)])
        _replay(sqlite_db, episode, "snapkv", snapkv, [span(0.5)])
        _replay(sqlite_db, episode, "nexus", nexus, [span(0.9)])
        _replay(sqlite_db, episode, "nexus", per_head, [span(0.3)])  # newer: merged, it would replace nexus's
        _replay(sqlite_db, episode, "snapkv", wide, [span(0.95)])  # newer: merged, it would be snapkv's
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    cells = {c.method: c for c in table.action}
    assert list(cells) == ["dense", "snapkv", "snapkv[window=32]", "nexus", VARIANT]
    assert cells["nexus"].copy_top1 == pytest.approx(0.9) and cells[VARIANT].copy_top1 == pytest.approx(0.3)
    assert cells["snapkv"].copy_top1 == pytest.approx(0.5)
    assert cells["snapkv[window=32]"].copy_top1 == pytest.approx(0.95)
    for label in ("nexus", VARIANT, "snapkv[window=32]"):  # each against the plain dense and the plain snapkv
        cell = cells[label]
        assert (cell.episodes, cell.paired, cell.tasks, cell.tasks_vs_dense, cell.tasks_vs_snapkv) == (5, 5, 5, 5, 5)
        assert cell.p_vs_dense == pytest.approx(2 / 32) and cell.p_vs_snapkv == pytest.approx(2 / 32)
    assert cells["snapkv"].p_vs_snapkv is None
    assert cells["dense"].copy_top1 == 1.0 and cells["dense"].delta_copy_nll == 0.0
    text = render(table, "markdown")
    assert f"| scope | protocol | density | dense | snapkv | snapkv[window=32] | nexus | {VARIANT} |" in text
    assert {d.method for d in table.action_by_distance} == set(cells)
    rich = render(table, "table", width=300)
    assert VARIANT in rich and "snapkv[window=32]" in rich
