"""A worker host cut off inside a transaction no longer freezes the job (issue 48): on the test's own PostgreSQL, a
worker session that takes the job lock and goes silent is ended by the server within its idle-in-transaction bound,
its lock released, and another worker's write goes on; and a worker's connections carry the bounds
(``db.session_bounds.WORKER_BOUNDS``) while a reader's carry only the keepalives."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from db import connect, job_rows
from db.claims import lock_job
from db.models import Job
from db.session_bounds import CONNECTION_BOUNDS, WORKER_BOUNDS
from jobs.queue import make_app
from jobs.settings import ServiceSettings
from tests.support.own_services import OwnPostgres
from workers import celery_tasks
from workers.faults.db_retry import is_transient

pytestmark = [pytest.mark.services, pytest.mark.slow]
SETTINGS = ("idle_in_transaction_session_timeout", "statement_timeout", "tcp_keepalives_idle",
            "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout")  # fmt: skip


@pytest.fixture(scope="module")
def pg():
    with OwnPostgres() as own:
        connect(own.url).dispose()  # migrated once
        yield own


def _in_effect(session) -> dict[str, str]:
    """Each setting as the server applies it to this session, in its base unit (ms or s)."""
    query = text("SELECT name, setting FROM pg_settings WHERE name = ANY(:names)")
    return dict(session.execute(query, {"names": list(SETTINGS)}).all())


def test_a_worker_connection_carries_the_bounds_and_a_reader_only_the_keepalives(pg):
    app = make_app(ServiceSettings(db_url=pg.url, broker_url="redis://127.0.0.1:1/0"))
    db = celery_tasks.database(app)  # what every task, heartbeat and hand-back of a worker process uses
    try:
        with db.session() as s:
            assert s.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "30s"
            assert s.execute(text("SHOW statement_timeout")).scalar() == "1min"
            shown = _in_effect(s)
            params = s.connection().connection.driver_connection.info.get_parameters()
    finally:
        celery_tasks._DB.pop(pg.url).dispose()
    assert shown == {**WORKER_BOUNDS.server_settings()} == {
        "idle_in_transaction_session_timeout": "30000", "statement_timeout": "60000", "tcp_keepalives_idle": "30",
        "tcp_keepalives_interval": "10", "tcp_keepalives_count": "3", "tcp_user_timeout": "60000",
    }  # fmt: skip
    assert {k: params.get(k) for k in ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_count")} == {
        "connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30", "keepalives_count": "3",
    }  # fmt: skip

    reader = connect(pg.url, upgrade=False)  # a CLI verb, the dashboard: streams rows while it prints them
    with reader.session() as s:
        assert _in_effect(s) == {**CONNECTION_BOUNDS.server_settings(), "statement_timeout": "0",
                                 "idle_in_transaction_session_timeout": "0"}  # fmt: skip
    reader.dispose()


def test_a_silent_session_holding_the_job_lock_is_ended_and_another_worker_writes(pg):
    bounds = replace(WORKER_BOUNDS, idle_in_transaction_s=2.0)  # the worker's 30 s, shortened for the test
    cut_off, other = connect(pg.url, upgrade=False, bounds=bounds), connect(pg.url, upgrade=False, bounds=bounds)
    with other.session() as s:
        job_id = job_rows.create_job(s, config={}, config_hash="ef" * 32, name="locked").id
    held = cut_off.sessions()
    held.begin()
    lock_job(held, job_id)  # what claim, finish and takeover take first; then its host is cut off
    holder = held.execute(text("SELECT pg_backend_pid()")).scalar()

    wrote: dict[str, float] = {}
    started = time.monotonic()

    def write() -> None:
        with other.session() as s:
            lock_job(s, job_id).error = "the other worker's write"
        wrote["after_s"] = time.monotonic() - started

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(30)
    assert 1.5 < wrote.get("after_s", 99) < 10, wrote  # it waited for the lock until the server ended the holder
    with other.session() as s:
        assert s.get(Job, job_id).error == "the other worker's write"
        alive = s.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": holder}).scalar()
    assert alive == 0
    with pytest.raises(DBAPIError) as ended:  # the worker, back, finds its session gone (IdleInTransactionSession-
        held.execute(text("SELECT 1"))  # Timeout, an InternalError) and retries its whole unit of work
    assert ended.value.connection_invalidated and is_transient(ended.value)
    held.close()
    cut_off.dispose()
    other.dispose()
