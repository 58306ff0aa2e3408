"""``jobs.control.rerun``, what `nexus-eval rerun JOB --failed` and the dashboard's rerun button call: new
attempt rows sent to the queue, and when the broker cannot take them, rows that stay queued and an error that
says so (``NotEnqueued``)."""

from __future__ import annotations

import pytest

from db import job_rows
from db import store as st
from jobs.control import NotEnqueued, rerun
from tests.db.test_db_store import Key, _job_with, _run_to
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)


class Sent:
    id = "celery-task-1"


class RecordingBroker:
    """Test double for the Celery app's broker side (outside our control): records what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send_task(self, name, args, retry):
        self.sent.append((name, args))
        return Sent()


class UnreachableBroker:
    """Test double for a broker that is down: every send fails as kombu's would."""

    def send_task(self, name, args, retry):
        raise ConnectionError("broker at redis://127.0.0.1:1/0 refused the connection")


def _finished_job(db) -> tuple[str, list[str]]:
    job_id, ids = _job_with(db, [Key("a", "dense"), Key("b", "dense")])
    _run_to(db, ids[0], grade="resolved")
    _run_to(db, ids[1], grade="unresolved")
    return job_id, ids


def test_rerun_stores_new_attempts_and_sends_them(sqlite_db):
    job_id, ids = _finished_job(sqlite_db)
    broker = RecordingBroker()
    new_ids = rerun(sqlite_db, job_id[:5], ["unresolved"], app=broker)
    assert len(new_ids) == 1 and [args for _, args in broker.sent] == [(new_ids[0],)]
    with sqlite_db.session() as s:
        row = st.get_episode(s, new_ids[0])
        assert (row.task_id, row.attempt, row.status, row.celery_task_id) == ("b", 2, "queued", "celery-task-1")


def test_rerun_with_the_broker_down_keeps_the_rows_queued_and_resume_sends_them(sqlite_db):
    from types import SimpleNamespace

    from jobs.settings import ServiceSettings
    from workers.celery_tasks import resume

    job_id, _ = _finished_job(sqlite_db)
    with pytest.raises(NotEnqueued, match=f"job {job_id}: 1 episode.*stored.*ConnectionError") as raised:
        rerun(sqlite_db, job_id, ["unresolved"], app=UnreachableBroker())
    assert f"`nexus-eval resume {job_id}`" in str(raised.value)
    (new_id,) = raised.value.episode_ids
    with sqlite_db.session() as s:
        row = st.get_episode(s, new_id)
        assert (row.attempt, row.status, row.celery_task_id) == (2, "queued", None)
        assert job_rows.get_job(s, job_id).error.startswith("not all episodes were sent")
    broker = RecordingBroker()
    broker.conf = SimpleNamespace(nexus_settings=ServiceSettings(db_url=sqlite_db.url))
    assert resume(sqlite_db, job_id, app=broker)["sent"] == 1
    assert [args for _, args in broker.sent] == [(new_id,)]
    with sqlite_db.session() as s:
        job = job_rows.get_job(s, job_id)
        assert (job.status, job.error) == ("running", None)


def test_rerun_bad_job_or_status(sqlite_db):
    job_id, _ = _finished_job(sqlite_db)
    with pytest.raises(LookupError):
        rerun(sqlite_db, "nope", ["unresolved"], app=RecordingBroker())
    with pytest.raises(ValueError):
        rerun(sqlite_db, job_id, ["unresolvd"], app=RecordingBroker())
