"""Every worker's sweeper marks the rows of workers that stopped reporting ``gone`` (issue 48: killed workers stayed
``ok`` in the ``workers`` table), writes its own as ``ok``, and leaves a worker that reported within the deadline."""

from __future__ import annotations

from datetime import timedelta

from db.models import WorkerRow, utcnow
from db.worker_rows import report_worker
from jobs.settings import LIVENESS
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from workers.faults.sweeper import Sweeper


def _states(db) -> dict[str, str]:
    with db.session() as s:
        return {row.name: row.state for row in s.query(WorkerRow)}


def test_a_sweep_marks_a_silent_worker_gone_and_keeps_itself_and_a_live_one_ok(sqlite_db):
    silent = LIVENESS.worker_gone_after_s
    now = utcnow()
    with sqlite_db.session() as s:
        report_worker(s, "killed-host/41/k", queues="gpu", state="ok", now=now - timedelta(seconds=silent + 30))
        report_worker(s, "live-host/42/k", queues="gpu", state="ok", now=now - timedelta(seconds=silent - 30))
    sent: list[str] = []
    sweeper = Sweeper(
        sqlite_db.url, LIVENESS, queues="gpu", send_run=sent.append, send_grade=sent.append, embedded=False,
        docker_check=lambda: "no Docker in this test",  # paused: the sweep leaves containers alone
    )  # fmt: skip
    sweeper.sweeps = 1  # a periodic sweep (the first one is recover_at_start)
    sweeper.sweep_once()
    states = _states(sqlite_db)
    assert states.pop(sweeper.name_in_db) == "paused" and sent == []
    assert states == {"killed-host/41/k": "gone", "live-host/42/k": "ok"}
