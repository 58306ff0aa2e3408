"""Measurement over several processes (measure.processes) stores what one process stores, in the same order.

Each measuring process loads the model and takes the next share (probe samples, replay groups) when done with one.
Splitting by sample or by source episode x protocol is exact, so a run measured with two processes must equal the
run measured in this process: the probe results in the same order with the same numbers, the replay rows with the
same scores. A failing process stops the run with its traceback.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from agent_runner.config import ModelSpec
from measure.probes import ProbeSettings
from measure.probes.parallel import measure
from measure.processes import MeasuringProcessError, resolve_processes, run_pool
from measure.replay import plan_replays, run_plan
from tests.measure.test_replay import host, make_job  # noqa: F401  (fixtures)
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def _numbers(result) -> dict:
    return {k: v for k, v in dataclasses.asdict(result).items() if k != "seconds"}


def test_a_probe_run_over_two_processes_equals_one_process():
    settings = ProbeSettings(model="tiny", samples=3, lengths=(256,), densities=(0.4,), variants=("dense", "snapkv"))
    spec = ModelSpec(name="tiny")
    one = list(measure(settings, spec, processes=1))
    two = list(measure(settings, spec, processes=2))
    assert one[0][0] == two[0][0] == "loaded" and one[0][1:] == two[0][1:]
    assert [_numbers(r) for r in two[1:]] == [_numbers(r) for r in one[1:]]
    assert len(one) - 1 == 3 * (2 + 2 * 2 + 2)  # 3 samples x (needle 2 + later_turn 2 x 2 + nll 2)


def test_a_probe_run_failing_in_a_measuring_process_records_the_first_cause(tmp_path):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    args = ["probe", "run", "--model", "tiny", "--lengths", "256", "--variants", "dense,snapkv", "--densities", "0.5",
            "--probes", "needle,nll", "--samples", "2", "--continuation", "1000000", "--processes", "2",
            "--db", str(tmp_path / "r.db")]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 1, done.output
    assert re.search(r"failed after \d+ of 8 results: ValueError: filler source '\w+' is shorter", done.output)


def test_a_replay_plan_over_two_processes_stores_the_same_rows(sqlite_db):
    from tests.measure.test_replay import tiny_model

    job_id, _ = make_job(sqlite_db, tiny_model(weights_seed=0))
    kw = dict(methods=["dense", "snapkv", "h2o"], protocols=["true_eviction", "full_context"], densities=[0.3, 0.6])
    seen = []
    one = run_plan(sqlite_db, plan_replays(sqlite_db, job_id, **kw), processes=1)
    two = run_plan(sqlite_db, plan_replays(sqlite_db, job_id, redo=True, **kw), processes=2,
                   progress=lambda r, done, total: seen.append((done, total)))  # fmt: skip
    assert len(one.results) == len(two.results) > 4 and seen[-1] == (len(two.results), len(two.results))
    key = lambda r: (r.item.episode_id, r.item.method, r.item.scope, r.item.protocol, r.item.eviction["density"])  # noqa: E731
    a, b = sorted(one.results, key=key), sorted(two.results, key=key)
    assert [(key(x), x.status, x.top1) for x in a] == [(key(x), x.status, x.top1) for x in b]
    assert all(x.nll_mean == pytest.approx(y.nll_mean, abs=1e-6) for x, y in zip(a, b, strict=True) if x.nll_mean)
    assert {x.status for x in a} >= {"ok"}


def _boom(state, item, emit):
    if item == 2:
        raise RuntimeError("sample 2 cannot be measured")
    emit(item)


def _nothing():
    return None


def test_a_failing_measuring_process_stops_the_run_with_its_traceback():
    with pytest.raises(MeasuringProcessError, match="sample 2 cannot be measured") as caught:
        list(run_pool(_nothing, _boom, [0, 1, 2, 3], processes=2))
    assert caught.value.cause == "RuntimeError: sample 2 cannot be measured"
    assert "Traceback" in str(caught.value) and "_boom" in str(caught.value)
    assert resolve_processes(3) == 3 and resolve_processes(0) >= 1
    with pytest.raises(ValueError, match=">= 0"):
        resolve_processes(-1)


def test_large_groups_are_split_in_balanced_chunks_that_score_the_same(sqlite_db, host, monkeypatch):  # noqa: F811
    import measure.replay_run as run

    sizes = lambda n: [len(c) for c in run._chunks(list(range(n)))]  # noqa: E731
    # a sweep's 55 settings of a source are one call (its stacks are one (scope, density) each: replay_cells)
    assert sizes(55) == [55] and sizes(10) == [10] and sizes(130) == [44, 44, 42] and sizes(64) == [64]
    job_id, _ = make_job(sqlite_db, host.model)
    kw = dict(methods=["dense", "snapkv", "h2o"], protocols=["true_eviction", "full_context"], densities=[0.3, 0.6])
    whole = run_plan(sqlite_db, plan_replays(sqlite_db, job_id, **kw), host=host)
    monkeypatch.setattr(run, "MAX_GROUP_ROWS", 2)
    split = run_plan(sqlite_db, plan_replays(sqlite_db, job_id, redo=True, **kw), host=host)
    key = lambda r: (r.item.episode_id, r.item.method, r.item.scope, r.item.protocol, r.item.eviction["density"])  # noqa: E731
    a, b = sorted(whole.results, key=key), sorted(split.results, key=key)
    assert [(key(x), x.status, x.top1) for x in a] == [(key(x), x.status, x.top1) for x in b]
    assert all(x.nll_mean == pytest.approx(y.nll_mean, abs=1e-5) for x, y in zip(a, b, strict=True) if x.nll_mean)
