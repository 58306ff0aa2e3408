"""The sweeper sends again the grade of an agent exit that nobody started grading (issue 48: a hand-off lost in a
Redis restart left its job running until `resume`): once per ``Liveness.grade_resend_s``, on every broker, never a
grade that is in flight (just handed off, claimed by a live grader, handed back a moment ago) or done, and never one
of a job that does not grade or is cancelled. Sends go through a real Celery app to the test's own Redis; what
arrives in the ``grade`` queue is counted there."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from db import job_rows, sqlite_url
from db import store as st
from db.models import Episode, utcnow
from jobs.queue import GRADE_TASK, make_app
from jobs.settings import LIVENESS, ServiceSettings
from tests.db.test_liveness import _grade_claim, _job, _row, _submitted
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from tests.support.own_services import OwnRedis
from tests.workers.test_broker_outage_sends import queued
from workers.celery_tasks import _senders
from workers.faults.recovery import sweep

pytestmark = pytest.mark.services
BOUND = LIVENESS.grade_resend_s


@pytest.fixture
def senders(tmp_path):
    with OwnRedis() as own:
        app = make_app(ServiceSettings(broker_url=own.url, db_url=sqlite_url(tmp_path / "unused.db")))
        yield _senders(app), lambda: [args[0] for name, args in queued(own.url, "grade") if name == GRADE_TASK]
        app.close()


def _age(db, episode_id: str, **columns_ago: float) -> None:
    """Move the row's ``finished_at`` / ``grade_sent_at`` that many seconds into the past."""
    with db.session() as s:
        values = {column: utcnow() - timedelta(seconds=ago) for column, ago in columns_ago.items()}
        s.execute(update(Episode).where(Episode.id == episode_id).values(**values))


def test_a_lost_grade_is_sent_again_once_per_bound_and_never_one_in_flight_or_done(sqlite_db, senders):
    send, grade_queue = senders
    db = sqlite_db
    job_id, (lost, recent, claimed, graded, queued_run, handed_back) = _job(db, 6)
    for episode_id in (lost, recent, claimed, graded, handed_back):
        _submitted(db, episode_id)
    for episode_id in (lost, claimed, graded, handed_back):
        _age(db, episode_id, finished_at=2 * BOUND)  # its hand-off was long ago
    _grade_claim(db, claimed)  # a live grader holds it
    _grade_claim(db, handed_back, ago=timedelta(seconds=LIVENESS.stale_after_s + 60))  # its grader is gone
    with db.session() as s:
        assert st.record_grade(s, graded, "resolved", test_log="ok", grader="test", grader_version="1")
    _, (no_grade,) = _job(db, 1, config={"grade": False})  # a job that does not grade: agent exits are final
    _submitted(db, no_grade)
    _age(db, no_grade, finished_at=2 * BOUND)
    cancelled_job, (cancelled,) = _job(db, 1)
    _submitted(db, cancelled)
    _age(db, cancelled, finished_at=2 * BOUND)
    with db.session() as s:
        job_rows.cancel_job(s, cancelled_job, "stop")

    first = sweep(db, LIVENESS, **send, docker_up=False)
    assert first.resent_grades == [lost] and first.grades == [handed_back]  # the gone grader's grade: handed back
    second = sweep(db, LIVENESS, **send, docker_up=False)  # another sweeper, a moment later
    assert not second and sorted(grade_queue()) == sorted([lost, handed_back])  # each sent exactly once
    assert _row(db, lost).grade_sent_at is not None and _row(db, recent).grade_sent_at is None

    _age(db, lost, grade_sent_at=BOUND + 1)  # a bound later, still nobody grades it: once more
    assert sweep(db, LIVENESS, **send, docker_up=False).resent_grades == [lost]
    assert sweep(db, LIVENESS, **send, docker_up=False).resent_grades == []
    assert sorted(grade_queue()) == sorted([lost, handed_back, lost])

    with db.session() as s:  # a grader finally took one of the copies: done, never sent again
        assert st.record_grade(s, lost, "unresolved", test_log="no", grader="test", grader_version="1")
    _age(db, lost, grade_sent_at=3 * BOUND)
    _age(db, recent, finished_at=BOUND - 60)  # still inside the bound
    assert sweep(db, LIVENESS, **send, docker_up=False).resent_grades == []
    assert len(grade_queue()) == 3 and _row(db, queued_run).status == "queued"
