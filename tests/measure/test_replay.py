"""Counterfactual replay through the service: stored token streams -> replay rows -> compare and the CLI.

The dense episodes' streams are real: the tiny Qwen3 decodes them greedily (so under dense true_eviction the
replay must find every stored token to be the model's own argmax). Turns are stored the way a worker stores
them, through ``workers.stored_records.turn_row`` and ``record_turn``.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re

import pytest
import torch
from sqlalchemy import select

import nexus
from agent_runner.model_host import ModelHost, ModelSpec, tiny_model
from agent_runner.records import Completion, TurnRecord
from db import job_rows
from db import store as st
from db.measure_models import Replay
from db.models import Turn
from db.replays import config_key
from jobs.spec import JobSpec
from measure.replay import plan_replays, replay_job
from nexus.config import keyed
from results.compare import compare_jobs
from results.compare_csv import REPLAY_COLUMNS
from results.compare_render import render
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)
from workers.stored_records import turn_row

TASKS = ["t1", "t2", "t3"]  # t1: an append-only (true_eviction) stream, t2: re-rendered history, t3: no stream
JOB = {
    "model": {"name": "tiny"},
    "methods": ["dense", "snapkv", "nexus"],
    "scopes": ["prefill_decode"],
    "protocols": ["true_eviction", "full_context"],
    "sampling": {"temperature": 0.0},
    "tasks": {"suite": "mini"},
}


@pytest.fixture(scope="module")
def host():
    """The tiny Qwen3 as ``load_host`` builds it, minus the tokenizer (a replay feeds ids) and with a smaller
    vocabulary (the streams use ids below 20000): the replay path is the same, the fixture 5 s faster."""
    model = tiny_model(weights_seed=0, vocab_size=20_000)
    nexus.prepare(model)
    return ModelHost(model=model, tokenizer=None, spec=ModelSpec(name="tiny"), device=torch.device("cpu"))


@torch.no_grad()
def greedy_turns(model, *, turns: int = 3, new_tokens: int = 16, rerender: bool = False, seed: int = 0):
    """A greedy dense run's per-turn streams: turn 0 feeds a 160-token prompt, each later turn 60 observation
    tokens after the previous stream, or (``rerender``) after all but its last 4 tokens, as a full_context
    run's re-rendered history differs from what was fed."""
    rng = random.Random(seed)
    out, previous = [], []
    for t in range(turns):
        keep = max(0, len(previous) - 4) if rerender else len(previous)
        append = [rng.randrange(1000, 20000) for _ in range(160 if t == 0 else 60)]
        ids = previous[:keep] + append
        generated = []
        for _ in range(new_tokens):
            logits = model(input_ids=torch.tensor([ids + generated]), logits_to_keep=1).logits[0, -1]
            generated.append(int(logits.argmax()))
        out.append({"keep": keep, "append": append, "generated": generated})
        previous = ids + generated[:-1]
    return out


def _turn_record(index: int, tokens: dict | None) -> TurnRecord:
    n = len(tokens["generated"]) if tokens else 3
    completion = Completion(text="<think>x</think>", tokens_generated=n, tokens=tokens)
    return TurnRecord(index=index, completion=completion, thought="x", action=None, observation="ok")


def make_job(db, model) -> tuple[str, dict[str, str]]:
    """The job of JOB over TASKS; its dense episodes finished with stored turns (non-dense ones stay queued)."""
    spec = JobSpec.from_dict(JOB)
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        rows = job_rows.add_episodes(s, job.id, spec.episodes(TASKS))
        dense = {r.task_id: r.id for r in rows if r.method == "dense"}
    streams = {"t1": greedy_turns(model), "t2": greedy_turns(model, rerender=True, seed=1), "t3": [None, None]}
    for task, episode_id in dense.items():
        run_stream(db, episode_id, streams[task])
    return job.id, dense


def run_stream(db, episode_id: str, turns: list) -> None:
    """Claim the episode, store its turns as a worker does (``turn_row``), finish it as ``submitted``."""
    with db.session() as s:
        claim = st.claim_episode(s, episode_id)
    for i, tokens in enumerate(turns):
        with db.session() as s:
            st.record_turn(s, claim, i, **turn_row(_turn_record(i, tokens)))
    with db.session() as s:
        st.finish_episode(s, claim, "submitted", patch="")


def test_turn_row_carries_the_token_stream(sqlite_db):
    tokens = {"keep": 0, "append": [1, 2, 3], "generated": [4, 5]}
    assert turn_row(_turn_record(0, tokens))["tokens"] == tokens
    assert turn_row(_turn_record(0, None))["tokens"] is None


def test_replay_job_stores_rows_compare_shows_them(any_db, host):
    job_id, dense = make_job(any_db, host.model)
    with any_db.session() as s:  # the stream round-trips through the turns table
        stored = s.execute(select(Turn.tokens).where(Turn.episode_id == dense["t1"]).order_by(Turn.index)).scalars()
        assert [t["keep"] for t in stored] == [0, 175, 250]
    with any_db.session() as s:
        before = compare_jobs(s, [job_id])
    assert before.replay == [] and "replay" not in before.to_dict()

    seen = []
    summary = replay_job(any_db, job_id, host=host, progress=lambda r, done, total: seen.append((done, total)))
    # 2 replayable episodes x (dense + snapkv + nexus) x 2 protocols; t2's stream is not append-only
    assert summary.counts == {"ok": 9, "skipped": 3, "failed": 0}
    assert seen[-1] == (12, 12)
    assert [(e, t) for e, t, _ in summary.missing] == [(dense["t3"], "t3")]
    assert "no stored token stream" in summary.missing[0][2]
    with any_db.session() as s:
        rows = {(r.task_id, r.method, r.protocol): r for r in s.execute(select(Replay)).scalars()}
    assert len(rows) == 12
    assert all(r.job_id == job_id and r.scope == "prefill_decode" for r in rows.values())
    own = rows[("t1", "dense", "true_eviction")]
    assert own.status == "ok" and own.top1 == 1.0 and own.tokens == 3 * 16  # greedy: its own argmax tokens
    assert [t["tokens"] for t in own.turns] == [16, 16, 16] and own.config["method"] == "dense"
    with any_db.session() as s:  # each method's settings are exactly those its live episodes of the job ran
        # the stored eviction leaves out the seed: the episode's own (issue 45), which the replay's settings carry
        live = {
            e.method: {**e.config["eviction"], "seed": e.seed}
            for e in st.latest_attempts(s, [job_id])
            if e.task_id == "t1"
        }
    for method in ("snapkv", "nexus"):
        for protocol in ("true_eviction", "full_context"):
            row = rows[("t1", method, protocol)]
            assert row.status == "ok" and sum(t["eviction_events"] for t in row.turns) > 0
            # as stored and keyed: a shared field at the default every older row ran with is left out (nexus.config)
            assert row.config == keyed(live[method])
    skipped = rows[("t2", "nexus", "true_eviction")]
    assert skipped.status == "skipped" and "full_context" in skipped.error and skipped.nll_mean is None
    assert rows[("t2", "nexus", "full_context")].status == "ok"

    cells = {(c.method, c.protocol): c for c in summary.cells}
    for protocol in ("true_eviction", "full_context"):
        assert cells[("dense", protocol)].delta_nll == 0.0  # dense against itself
        assert cells[("nexus", protocol)].n_pairs == (1 if protocol == "true_eviction" else 2)
    assert cells[("snapkv", "true_eviction")].skipped == 1

    with any_db.session() as s:
        table = compare_jobs(s, [job_id])
    by = {(c.scope, c.protocol, c.method): c for c in table.replay}
    fc = by[("prefill_decode", "full_context", "snapkv")]
    assert (fc.episodes, fc.tasks, fc.n_pairs, fc.pair_tasks) == (2, 2, 2, 2) and fc.delta_nll is not None
    assert fc.delta_ci_low is None and fc.delta_ci_high is None  # 2 tasks: too few for an interval
    data = json.loads(render(table, "json"))
    assert {(c["method"], c["protocol"]) for c in data["replay"]} == {(m, p) for m, p in cells}
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert set(REPLAY_COLUMNS) <= set(lines[0]) and all(None not in line.values() for line in lines)
    line = next(r for r in lines if (r["protocol"], r["method"]) == ("full_context", "snapkv"))
    assert float(line["delta_nll_vs_dense"]) == pytest.approx(fc.delta_nll, abs=1e-5)
    assert "Counterfactual replay:" in render(table, "markdown") and "ΔNLL vs dense" in render(table, "table")


def test_rerun_replaces_rows_and_token_by_token_matches_chunks(sqlite_db, host):
    job_id, dense = make_job(sqlite_db, host.model)
    first = replay_job(sqlite_db, job_id, methods=["nexus"], protocols=["full_context"], host=host)
    # dense was not asked for: it is replayed anyway where an episode has no baseline under the protocol
    assert sorted((r.item.method, r.status) for r in first.results) == [("dense", "ok")] * 2 + [("nexus", "ok")] * 2
    with sqlite_db.session() as s:
        old = {r.id: r for r in s.execute(select(Replay)).scalars()}
    again = replay_job(sqlite_db, job_id, methods=["nexus"], protocols=["full_context"], chunked=False, host=host)
    assert [r.item.method for r in again.results] == ["nexus", "nexus"]  # the dense baseline exists now
    with sqlite_db.session() as s:
        new = list(s.execute(select(Replay)).scalars())
    assert len(new) == 4 and {r.method for r in new} == {"dense", "nexus"}
    for row in (r for r in new if r.method == "nexus"):
        assert row.id not in old and row.chunked is False
        before = next(o for o in old.values() if (o.episode_id, o.method) == (row.episode_id, "nexus"))
        assert row.config_key == before.config_key == config_key(before.config, None, before.dtype)
        assert row.nll_mean == pytest.approx(before.nll_mean, abs=1e-4) and row.top1 == before.top1


def test_replays_at_several_densities_are_a_sweep_on_the_same_trajectories(sqlite_db, host):
    from dashboard.tradeoff_charts import delta_nll_vs_density_chart

    job_id, _ = make_job(sqlite_db, host.model)
    summary = replay_job(
        sqlite_db, job_id, methods=["nexus"], protocols=["full_context"], densities=[0.1, 0.5], host=host
    )
    # 2 replayable episodes x (dense baseline once + nexus at 2 densities)
    assert sorted((r.item.method, r.item.eviction["density"]) for r in summary.results) == sorted(
        [("dense", 0.2)] * 2 + [("nexus", 0.1)] * 2 + [("nexus", 0.5)] * 2
    )
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job_id])
    cells = {(c.method, c.density): c for c in table.replay}
    assert set(cells) == {("dense", None), ("nexus", 0.1), ("nexus", 0.5)}
    assert cells[("nexus", 0.1)].n_pairs == cells[("nexus", 0.5)].n_pairs == 2
    assert cells[("nexus", 0.1)].delta_nll != cells[("nexus", 0.5)].delta_nll
    line = next(r for r in csv.DictReader(io.StringIO(render(table, "csv"))) if r["row_density"] == "0.5")
    assert line["method"] == "nexus" and float(line["delta_nll_vs_dense"]) == pytest.approx(
        cells[("nexus", 0.5)].delta_nll, abs=1e-5
    )
    svg = delta_nll_vs_density_chart(table)
    assert sorted(re.findall(r'class="point" data-method="nexus" data-density="([\d.]+)"', svg)) == ["0.1", "0.5"]
    with pytest.raises(ValueError, match=r"density must be in \(0, 1\], got 1.5"):
        plan_replays(sqlite_db, job_id, densities=[0.2, 1.5])


def test_plan_refuses_bad_names_and_jobs_before_any_model(sqlite_db):
    spec = JobSpec.from_dict(JOB)
    with sqlite_db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        job_rows.add_episodes(s, job.id, [e for e in spec.episodes(TASKS) if e.method != "dense"])
    with pytest.raises(ValueError, match="unknown method 'bogus'"):
        plan_replays(sqlite_db, job.id, methods=["bogus"])
    with pytest.raises(ValueError, match="unknown scope"):
        plan_replays(sqlite_db, job.id, scopes=["everywhere"])
    with pytest.raises(ValueError, match="unknown protocol"):
        plan_replays(sqlite_db, job.id, protocols=["half_context"])
    with pytest.raises(LookupError, match="no job"):
        plan_replays(sqlite_db, "nosuchjob")
    with pytest.raises(ValueError, match="no dense episode"):
        plan_replays(sqlite_db, job.id)


def test_cli_errors_name_the_problem(sqlite_db):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    spec = JobSpec.from_dict(JOB)
    with sqlite_db.session() as s:
        job_id = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash()).id
    runner = CliRunner()
    bad = runner.invoke(app, ["replay", job_id, "--methods", "snapkv,bogus", "--db", sqlite_db.url])
    assert bad.exit_code == 2 and "unknown method 'bogus'" in bad.output
    assert runner.invoke(app, ["replay", "zzzz", "--db", sqlite_db.url]).exit_code == 2
    assert "no dense episode" in runner.invoke(app, ["replay", job_id, "--db", sqlite_db.url]).output


def test_cli_replays_and_prints_the_table(sqlite_db, host, monkeypatch):
    from typer.testing import CliRunner

    import agent_runner.loaded_models
    from nexus_eval.cli import app

    job_id, _ = make_job(sqlite_db, host.model)
    monkeypatch.setattr(agent_runner.loaded_models, "host_for", lambda spec: host)
    args = ["replay", job_id, "--methods", "dense,snapkv", "--protocols", "full_context", "--dtype", "float32"]
    args += ["--db", sqlite_db.url]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "not replayed" in result.output and "t3" in result.output  # the episode without a stream is named
    assert "snapkv" in result.output and "+0.000 (2 tasks: too few for an interval)" in result.output  # dense


def test_replay_only_cells_get_csv_lines_and_pairing_prefers_the_same_scope():
    from results.compare import build_table
    from results.compare_table import Outcome
    from results.replay_stats import ReplayOutcome, summarize_replays

    def r(ep, task, method, scope, nll):
        return ReplayOutcome(ep, task, method, scope, "true_eviction", "ok", nll, 1.0, 10)

    cells = summarize_replays(
        [
            r("e1", "a", "dense", "prefill_only", 1.0),
            r("e1", "a", "dense", "prefill_decode", 1.5),  # a second dense baseline, under the method's scope
            r("e1", "a", "h2o", "prefill_decode", 2.0),
            r("e2", "b", "dense", "prefill_only", 1.0),
            r("e2", "b", "h2o", "prefill_decode", 1.25),  # no dense under prefill_decode: the other scope's
        ]
    )
    h2o = next(c for c in cells if c.method == "h2o")
    assert h2o.n_pairs == 2 and h2o.delta_nll == pytest.approx((0.5 + 0.25) / 2)
    assert (h2o.delta_ci_low, h2o.delta_ci_high) == (None, None)  # two tasks: too few for a bootstrap interval
    table = build_table([Outcome("a", "dense", "prefill_only", "true_eviction", 0, "resolved")])
    table.replay = cells
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert [(x["scope"], x["method"], x["n"]) for x in lines] == [
        ("prefill_only", "dense", "1"),
        ("prefill_decode", "dense", ""),
        ("prefill_decode", "h2o", ""),
    ]
    assert all(None not in x.values() for x in lines) and lines[2]["replay_pairs"] == "2"


# --- issue 31: replay sources are each key's counted agent attempt; NLL and ΔNLL over the same pairs --------------


def test_replay_scores_only_each_keys_result_attempt_never_an_interactive_or_superseded_one(sqlite_db, host):
    """An operator's interactive attempt of a dense key is not a replay source (a person steered or chose it); an
    attempt whose grading broke and was rerun is superseded: its replay rows are left out of compare, with a note."""
    job_id, dense = make_job(sqlite_db, host.model)
    t1 = dense["t1"]
    with sqlite_db.session() as s:
        interactive = st.new_attempt(s, t1, driver="interactive").id
    run_stream(sqlite_db, interactive, greedy_turns(host.model, seed=7))
    plan = plan_replays(sqlite_db, job_id, methods=["snapkv"], protocols=["full_context"])
    assert {i.episode_id for i in plan.items} == {t1, dense["t2"]}  # the agent's attempt, not the newest row
    replay_job(sqlite_db, job_id, methods=["snapkv"], protocols=["full_context"], host=host)
    with sqlite_db.session() as s:  # t1's grading broke: its attempt is no longer a sample; a rerun replaces it
        st.record_grade(s, t1, "infra_failure", test_log="", grader="test")
        (retry,) = st.rerun_job(s, job_id, {"infra_failure"})
    run_stream(sqlite_db, retry.id, greedy_turns(host.model, seed=3))
    plan = plan_replays(sqlite_db, job_id, methods=["snapkv"], protocols=["full_context"])
    assert {i.episode_id for i in plan.items} >= {retry.id} and t1 not in {i.episode_id for i in plan.items}
    replay_job(sqlite_db, job_id, methods=["snapkv"], protocols=["full_context"], host=host)
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job_id])
    cell = next(c for c in table.replay if (c.method, c.protocol) == ("snapkv", "full_context"))
    assert (cell.episodes, cell.tasks, cell.n_pairs) == (2, 2, 2)  # t1's retry and t2, never the superseded t1
    assert any(
        n.startswith("replay: 2 row(s) replay an attempt that is no longer its key's result") for n in table.notes
    )


def test_nll_top1_and_delta_nll_are_over_the_same_pairs():
    from results.replay_stats import ReplayOutcome, summarize_replays

    rows = [
        ReplayOutcome("e1", "a", "dense", "prefill_only", "true_eviction", "ok", 1.0, 0.9, 10),
        ReplayOutcome("e1", "a", "snapkv", "prefill_only", "true_eviction", "ok", 1.5, 0.8, 10, 0.2),
        ReplayOutcome("e2", "b", "snapkv", "prefill_only", "true_eviction", "ok", 9.0, 0.1, 10, 0.2),  # no dense
    ]
    snapkv = next(c for c in summarize_replays(rows) if c.method == "snapkv")
    assert (snapkv.episodes, snapkv.n_pairs, snapkv.pair_tasks, snapkv.unpaired) == (2, 1, 1, 1)
    assert (snapkv.nll_mean, snapkv.top1, snapkv.delta_nll) == (1.5, 0.8, 0.5)  # e2 is in no mean
