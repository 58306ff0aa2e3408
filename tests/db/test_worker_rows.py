"""``db.worker_rows``: a worker that stopped writing its row is marked ``gone`` (issue 48: dead workers stayed ``ok``
in the ``workers`` table), a report brings it back, and the lists show gone workers for an hour."""

from __future__ import annotations

from datetime import timedelta

import pytest

from db.models import WorkerRow, utcnow
from db.worker_rows import GONE_LISTED_S, mark_gone_workers, recent_workers, report_worker
from jobs.settings import LIVENESS, Liveness
from tests.support.db_fixtures import any_db_fixture  # noqa: F401  (fixture)

SILENT = LIVENESS.worker_gone_after_s


def _row(db, name: str) -> tuple:
    with db.session() as s:
        row = s.get(WorkerRow, name)
        return row.state, row.state_since, row.detail


def test_the_deadline_is_the_holders_bound_and_never_under_three_sweeps():
    assert SILENT == LIVENESS.stale_after_s == 150.0
    assert Liveness(heartbeat_s=15, stale_after_s=60, sweep_s=60).worker_gone_after_s == 180.0


def test_a_silent_worker_is_marked_gone_once_and_comes_back_when_it_reports(any_db):
    now = utcnow()
    with any_db.session() as s:
        report_worker(s, "hosta/1/k", queues="gpu", state="ok", now=now - timedelta(seconds=SILENT + 1))
        report_worker(s, "hostb/2/k", queues="gpu", state="paused", detail="docker", now=now - timedelta(seconds=400))
        report_worker(s, "hostc/3/k", queues="grade", state="ok", now=now - timedelta(seconds=SILENT - 5))
    with any_db.session() as s:
        assert sorted(mark_gone_workers(s, silent_s=SILENT, now=now)) == ["hosta/1/k", "hostb/2/k"]
    state, since, detail = _row(any_db, "hosta/1/k")
    assert (state, since) == ("gone", now) and "no report for over 150 s" in detail
    assert _row(any_db, "hostc/3/k")[0] == "ok"  # inside the deadline
    with any_db.session() as s:  # a later sweep does not mark it again (its state_since stays when it went)
        assert mark_gone_workers(s, silent_s=SILENT, now=now + timedelta(seconds=60)) == ["hostc/3/k"]  # its turn
    assert _row(any_db, "hosta/1/k")[1] == now

    back = now + timedelta(seconds=90)
    with any_db.session() as s:  # the same process reports again (a long pause, a database outage): ok again
        report_worker(s, "hosta/1/k", queues="gpu", state="ok", now=back)
    assert _row(any_db, "hosta/1/k") == ("ok", back, None)


@pytest.mark.parametrize("gone_ago", [60.0, GONE_LISTED_S - 1, GONE_LISTED_S + 1])
def test_lists_show_a_gone_worker_for_an_hour_and_the_window_alone_never(any_db, gone_ago):
    now = utcnow()
    went = now - timedelta(seconds=gone_ago)
    with any_db.session() as s:
        report_worker(s, "alive/1/k", queues="gpu", state="ok", now=now)
        report_worker(s, "dead/2/k", queues="gpu", state="ok", now=went - timedelta(seconds=SILENT + 1))
        mark_gone_workers(s, silent_s=SILENT, now=went)
    with any_db.session() as s:
        listed = [(w.name, w.state) for w in recent_workers(s, within_s=90, now=now, gone_within_s=GONE_LISTED_S)]
        plain = [w.name for w in recent_workers(s, within_s=90, now=now)]
    shown = gone_ago < GONE_LISTED_S
    assert listed == [("alive/1/k", "ok")] + ([("dead/2/k", "gone")] if shown else [])
    assert plain == ["alive/1/k"]  # who listens on a queue (submit's note, doctor's count): reporting workers only
