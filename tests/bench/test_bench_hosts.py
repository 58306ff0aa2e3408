"""bench/hosts.py: the per-host split, the per-episode parts keyed by the host that ran each episode, the summary,
the ratio and the table, on hand-made rows (the run itself needs root, Docker and the host bed: not here)."""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from rich.console import Console

from tests.bench.conftest import load_script

T0 = datetime(2025, 1, 1, 12, 0, 0)
GRADER = "s-host/7/k0"  # what episodes.worker holds once graded: the same for every row


def _row(n: int, runner: str | None, started: float, finished: float | None, *, grade_s: float = 2.0):
    """Episode ``n`` (created at T0) run by ``runner`` from ``started`` to ``finished`` s; graded 1 s after grading."""
    at = lambda s: None if s is None else T0 + timedelta(seconds=s)  # noqa: E731
    graded = None if finished is None else finished + grade_s + 1.0
    return SimpleNamespace(
        id=f"e{n}",
        task_id="humanfmt__humanfmt-1",
        status="submitted" if finished is not None else "running",
        created_at=T0,
        started_at=at(started),
        finished_at=at(finished),
        graded_at=at(graded),
        grade_s=grade_s,
        worker=GRADER if finished is not None else runner,
        result=None
        if finished is None
        else {"worker": runner, "service_timings": {"claim_s": 0.1, "db_turns_s": 0.2, "finish_s": 0.1}},
    )


@pytest.fixture(scope="module")
def bench():
    return load_script("hosts")


@pytest.fixture
def rows():
    # A runs e1 then e3; B runs e2 then e4, each starting 1 s (e2: 2 s) after its own host's previous finish
    return [
        _row(1, "a-host/11/k1", 1, 11),
        _row(2, "b-host/11/k2", 2, 12),
        _row(3, "a-host/11/k1", 12, 22),
        _row(4, "b-host/11/k2", 13, 23),
        _row(5, "a-host/11/k1", 23, None),  # still running: counted as an episode, not as run or timed
    ]


def test_host_of_reads_the_hostname_part_of_an_identity(bench):
    assert bench.host_of("a-host/123/abcdef-42") == "a-host"
    assert bench.host_of("b-host") == "b-host"
    assert bench.host_of(None) == "?" and bench.host_of("") == "?"


def test_per_host_counts_the_runner_not_the_grader_and_only_finished_runs(bench, rows):
    assert bench.per_host(rows) == {"a-host": 2, "b-host": 2}
    assert bench.runner_of(rows[0]) == "a-host/11/k1" and rows[0].worker == GRADER


def test_pickup_is_measured_from_the_same_hosts_previous_finish(bench, rows):
    eps = {e["episode"]: e for e in bench.timings(rows)}
    assert sorted(eps) == ["e1", "e2", "e3", "e4"]
    # keyed by the grader (row.worker) e2..e4 would read 0 s (after A's finish at 11 s, B's e2 "started early")
    assert [round(eps[k]["pickup_s"], 6) for k in ("e1", "e2", "e3", "e4")] == [1.0, 2.0, 1.0, 1.0]
    assert eps["e1"]["db_s"] == pytest.approx(0.4)
    assert eps["e1"]["agent_s"] == pytest.approx(10 - 0.4)
    assert eps["e1"]["handoff_s"] == pytest.approx(1.0)
    assert eps["e1"]["wall_s"] == pytest.approx(1 + 10 + 1 + 2)


def test_summary_holds_wall_rate_split_and_medians(bench, rows):
    run = bench.summarize(rows, 90.0, job_id="j1", hosts=("A", "B"))
    assert run["episodes"] == 5 and run["graded"] == 4
    assert run["episodes_per_hour"] == pytest.approx(5 / 90 * 3600)
    assert run["per_host"] == {"a-host": 2, "b-host": 2}
    assert run["statuses"] == {"running": 1, "submitted": 4}
    assert run["median"]["pickup_s"] == pytest.approx(1.0)
    assert run["median"]["grade_s"] == pytest.approx(2.0)
    assert run["overhead_share_median"] == pytest.approx((1 + 0.4 + 1) / 14)
    assert run["overhead_share_with_grading_median"] == pytest.approx((1 + 0.4 + 1 + 2) / 14)
    assert run["grader_busy_share"] == pytest.approx(4 * 2.0 / 90)
    assert run["runs_done_s"] == pytest.approx(23.0)  # e4's finish; e5 still runs
    assert run["graded_s"] == pytest.approx(26.0)  # e4's verdict: 23 + 2 s grading + 1 s


def test_ratio_and_table(bench, rows):
    one = bench.summarize(rows, 120.0, job_id="j1", hosts=("A",))
    two = bench.summarize(rows, 80.0, job_id="j2", hosts=("A", "B"))
    ratio = bench.speedup(one, two)
    assert ratio == pytest.approx(1.5)
    out = io.StringIO()
    Console(file=out, width=300).print(bench.table({"1 host": one, "2 hosts": two}, ratio))
    text = out.getvalue()
    assert "wall(1 host) / wall(2 hosts) = 1.50" in text
    assert "a-host 2, b-host 2" in text
    assert "10%" in text  # the grader busy 8 s of 80
    assert "120.0" in text and "80.0" in text and "225" in text  # 5 episodes / 80 s = 225 / h


def test_job_spec_rounds_up_to_whole_seeds_over_the_four_tasks(bench):
    spec = bench.job_spec(10, "x")
    assert spec.seeds == [0, 1, 2] and spec.backend == "oracle" and spec.methods == ["dense"]
    assert bench.job_spec(200, "x").seeds == list(range(50))
