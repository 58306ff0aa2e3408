"""A replay sweep resumes where it stopped: what is stored ``ok`` (measured the same way) is never measured again.

``plan_replays`` leaves out of ``plan.items`` every replay whose configuration (episode, method, scope, protocol,
``config_key``) already has an ``ok`` row with the same ``chunked`` and lists it in ``plan.done``; failed and
skipped rows are planned again; ``redo=True`` plans every one. The replays run on the tiny random Qwen3 of
``test_replay`` (its ``host`` fixture and job).
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from db import job_rows
from db import store as st
from db.measure_models import Replay
from db.replays import config_key, record_replay
from jobs.spec import JobSpec
from measure.replay import plan_replays, replay_job, run_plan
from tests.measure.test_replay import JOB, host, make_job, run_stream  # noqa: F401  (host: a fixture)
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)

#: 2 replayable episodes x (dense + snapkv and nexus at 2 densities) under full_context: 10 replays, all ok
SWEEP = {"methods": ["dense", "snapkv", "nexus"], "protocols": ["full_context"], "densities": [0.1, 0.5]}


class Killed(Exception):
    """Stands for the process being killed part way through a sweep."""


def killed_after(k: int):
    def progress(result, done, total):
        if done == k:
            raise Killed

    return progress


def key(item) -> tuple:
    return (item.episode_id, item.method, item.scope, item.protocol, config_key(item.eviction, item.model, item.dtype))


def stored(db) -> dict[tuple, Replay]:
    """The job's rows by configuration (the key a rerun replaces)."""
    with db.session() as s:
        rows = list(s.execute(select(Replay)).scalars())
        s.expunge_all()
    by = {(r.episode_id, r.method, r.scope, r.protocol, r.config_key): r for r in rows}
    assert len(by) == len(rows)
    return by


def cell_numbers(summary) -> dict:
    return {(c.method, c.protocol, c.density): (c.episodes, c.n_pairs, c.nll_mean, c.delta_nll) for c in summary.cells}


def test_a_killed_sweep_run_again_measures_only_what_is_missing(sqlite_db, host):  # noqa: F811
    job_id, _ = make_job(sqlite_db, host.model)
    whole = plan_replays(sqlite_db, job_id, **SWEEP)  # what one uninterrupted run measures
    assert len(whole.items) == 10 and whole.done == []

    with pytest.raises(Killed):
        replay_job(sqlite_db, job_id, host=host, progress=killed_after(4), **SWEEP)
    before = stored(sqlite_db)
    assert len(before) == 4 and all(r.status == "ok" for r in before.values())

    plan = plan_replays(sqlite_db, job_id, **SWEEP)
    assert {key(i) for i in plan.done} == set(before)
    assert [key(i) for i in plan.items] == [key(i) for i in whole.items if key(i) not in before]
    summary = run_plan(sqlite_db, plan, host=host)
    assert summary.counts == {"ok": 6, "skipped": 0, "failed": 0}  # exactly the 6 missing, nothing twice
    assert {key(r.item) for r in summary.results}.isdisjoint(before)

    after = stored(sqlite_db)
    assert set(after) == {key(i) for i in whole.items}  # the configurations of one uninterrupted run
    for k, row in before.items():  # the rows measured before the kill are untouched
        assert (after[k].id, after[k].created_at, after[k].nll_mean) == (row.id, row.created_at, row.nll_mean)
    # the summary is over every stored row: the first run's t1 rows pair with the second run's t2 rows
    cells = {(c.method, c.density): c for c in summary.cells}
    assert set(cells) == {("dense", None), ("snapkv", 0.1), ("snapkv", 0.5), ("nexus", 0.1), ("nexus", 0.5)}
    assert all(c.episodes == 2 and c.n_pairs == 2 for m, c in cells.items() if m[0] != "dense")

    again = replay_job(sqlite_db, job_id, host=None, **SWEEP)  # nothing left: no model is loaded
    assert again.results == [] and cell_numbers(again) == cell_numbers(summary)
    assert {r.id for r in stored(sqlite_db).values()} == {r.id for r in after.values()}


def test_redo_measures_every_replay_again(sqlite_db, host):  # noqa: F811
    job_id, _ = make_job(sqlite_db, host.model)
    replay_job(sqlite_db, job_id, host=host, **SWEEP)
    first = stored(sqlite_db)
    plan = plan_replays(sqlite_db, job_id, redo=True, **SWEEP)
    assert len(plan.items) == 10 and plan.done == []
    summary = replay_job(sqlite_db, job_id, host=host, redo=True, **SWEEP)
    assert summary.counts["ok"] == 10
    second = stored(sqlite_db)
    assert set(second) == set(first) and {r.id for r in second.values()}.isdisjoint(r.id for r in first.values())


def test_failed_skipped_and_otherwise_measured_rows_are_planned_again(sqlite_db, host):  # noqa: F811
    job_id, dense = make_job(sqlite_db, host.model)
    summary = replay_job(sqlite_db, job_id, host=host, methods=["snapkv"], protocols=["true_eviction", "full_context"])
    # t2's stream re-renders its history: its true_eviction replays are skipped
    assert summary.counts == {"ok": 6, "skipped": 2, "failed": 0}
    snapkv = {(r.item.task_id, r.item.protocol): r.item for r in summary.results if r.item.method == "snapkv"}
    failed = snapkv[("t1", "full_context")]
    with sqlite_db.session() as s:  # as if its run had broken
        source = st.get_episode(s, failed.episode_id)
        record_replay(
            s,
            source,
            method="snapkv",
            scope=failed.scope,
            protocol=failed.protocol,
            config=failed.eviction,
            status="failed",
            error="RuntimeError: out of memory",
            dtype=failed.dtype,
        )
    plan = plan_replays(sqlite_db, job_id, methods=["snapkv"], protocols=["true_eviction", "full_context"])
    skipped = {key(r.item) for r in summary.results if r.status == "skipped"}  # t2's dense and snapkv
    assert {key(i) for i in plan.items} == skipped | {key(failed)}
    assert {key(i) for i in plan.done} == {key(snapkv[("t1", "true_eviction")]), key(snapkv[("t2", "full_context")])}
    again = run_plan(sqlite_db, plan, host=host)
    assert sorted((r.item.task_id, r.item.protocol, r.status) for r in again.results) == [
        ("t1", "full_context", "ok"),  # the failure is retried
        ("t2", "true_eviction", "skipped"),
        ("t2", "true_eviction", "skipped"),
    ]
    assert stored(sqlite_db)[key(failed)].status == "ok"
    # token by token is another measurement: the chunked rows do not count as done for it, nor the other way round
    by_token = plan_replays(sqlite_db, job_id, methods=["snapkv"], protocols=["full_context"], chunked=False)
    assert by_token.done == [] and {i.episode_id for i in by_token.items} == {dense["t1"], dense["t2"]}
    assert {i.method for i in by_token.items} == {"snapkv"}  # the dense baselines are there (ok) already


# --- the CLI -----------------------------------------------------------------------------------------------------


@pytest.mark.slow  # over 10 s: the default run leaves it to CI
def test_cli_says_it_resumes_and_all_stored_still_prints_the_table(sqlite_db, host, monkeypatch):  # noqa: F811
    from typer.testing import CliRunner

    import agent_runner.loaded_models
    from nexus_eval.cli import app

    job_id, _ = make_job(sqlite_db, host.model)
    replay_job(sqlite_db, job_id, host=host, methods=["dense"], protocols=["full_context"])  # 2 of 4 stored
    monkeypatch.setattr(agent_runner.loaded_models, "host_for", lambda spec: host)
    runner, env = CliRunner(), {"COLUMNS": "200"}
    args = ["replay", job_id, "--methods", "dense,snapkv", "--protocols", "full_context", "--dtype", "float32"]
    args += ["--db", sqlite_db.url]

    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "resuming: 2 of 4 replays already stored, 2 to run (--redo measures them again)" in result.output
    assert "[2/2] ok snapkv" in result.output and "[1/2] ok dense" not in result.output
    assert "2 ok, 2 stored before" in result.output

    def no_model(spec):
        raise AssertionError("a model was loaded with nothing to run")

    monkeypatch.setattr(agent_runner.loaded_models, "host_for", no_model)
    done = runner.invoke(app, args, env=env)
    assert done.exit_code == 0, done.output
    assert "all 4 replays already stored, none to run (--redo measures them again)" in done.output
    assert "nothing to replay" not in done.output and "4 stored before" in done.output
    assert "snapkv" in done.output and "+0.000 (2 tasks: too few for an interval)" in done.output  # the table

    monkeypatch.setattr(agent_runner.loaded_models, "host_for", lambda spec: host)
    redo = runner.invoke(app, [*args, "--redo"], env=env)
    assert redo.exit_code == 0, redo.output
    assert "already stored" not in redo.output and "[4/4] ok" in redo.output
    # a token-by-token run measures again what was measured in chunks
    by_token = runner.invoke(app, [*args, "--token-by-token"], env=env)
    assert by_token.exit_code == 0 and "already stored" not in by_token.output and "[4/4] ok" in by_token.output

    # a job with nothing to replay still says so
    spec = JobSpec.from_dict(JOB)
    with sqlite_db.session() as s:
        empty = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash()).id
        (episode,) = [e for e in job_rows.add_episodes(s, empty, spec.episodes(["t3"])) if e.method == "dense"]
    run_stream(sqlite_db, episode.id, [None, None])
    nothing = runner.invoke(app, ["replay", empty, "--db", sqlite_db.url], env=env)
    assert nothing.exit_code == 1 and "nothing to replay" in nothing.output and "already stored" not in nothing.output


def test_agent_case_resumes_its_replays_and_an_interrupted_one_names_the_command_that_continues(sqlite_db, monkeypatch):
    """``agent-case`` plans its replays as ``replay`` does (stored ok: not again, ``--redo``: again); killed while
    replaying, it prints the ``nexus-eval replay`` line that continues them. Its job run (containers) is stood in
    for by an expert job with one stored demonstration (``test_text_replay_job``)."""
    from typer.testing import CliRunner

    import agent_runner.loaded_models
    import nexus_eval.commands.service
    from nexus_eval.cli import app
    from tests.measure.test_text_replay_job import TASK, expert_job
    from tests.tiny_models import tiny_host

    tiny = tiny_host()
    job_id, _ = expert_job(sqlite_db)
    monkeypatch.setattr(nexus_eval.commands.service, "run_here", lambda plan, db, console: (sqlite_db, job_id))
    monkeypatch.setattr(agent_runner.loaded_models, "host_for", lambda spec: tiny)
    settings = ["--model", "tiny", "--methods", "dense,snapkv", "--scopes", "prefill_only"]
    settings += ["--protocols", "full_context", "--densities", "0.2", "--dtype", "float32", "--db", sqlite_db.url]
    args = ["agent-case", "--tasks", TASK, *settings, "--format", "json"]
    runner = CliRunner()

    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "[2/2] ok" in first.output and "already stored" not in first.output

    def interrupted(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr(agent_runner.loaded_models, "host_for", interrupted)
    again = runner.invoke(app, args)  # nothing to run: no model is loaded
    assert again.exit_code == 0, again.output
    assert "all 2 replays already stored, none to run (--redo measures them again)" in again.output
    redo = runner.invoke(app, [*args, "--redo"])
    assert redo.exit_code == 130 and "already stored" not in redo.output
    assert f"interrupted: `nexus-eval replay {job_id} {' '.join(settings)}` continues where it stopped" in redo.output
