"""Revision 0012: ``workers.state`` may read ``gone`` and ``episodes.grade_sent_at`` exists. Rows stored at 0011 come
through whole (a worker row, an episode: grade_sent_at NULL); the downgrade turns gone rows back to ok (what a dead
worker's row read before) and drops the column. On SQLite (the workers table rebuilt) and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, select, update
from sqlalchemy.exc import IntegrityError

from db import sqlite_url
from db.connection import _alembic_config, make_engine
from tests.support.db_fixtures import make_pg_database

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WORKER = dict(name="h/1/k", queues="gpu", state="ok", detail=None, started_at=NOW, seen_at=NOW, state_since=NOW)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "old.db")
        return
    url, drop = make_pg_database()
    yield url
    drop()


def _tables(url: str):
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    return engine, t.tables


def _rows(url: str, table: str) -> list[dict]:
    engine, tables = _tables(url)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(tables[table]))]
    engine.dispose()
    return rows


def _set_gone(url: str) -> None:
    engine, tables = _tables(url)
    with engine.begin() as conn:
        conn.execute(update(tables["workers"]).values(state="gone"))
    engine.dispose()


def test_0012_allows_gone_workers_and_adds_grade_sent_at_keeping_every_row(url):
    command.upgrade(_alembic_config(url), "0011")
    engine, tables = _tables(url)
    episode = dict(id="e1", job_id="j1", task_id="t1", episode_key="k1", attempt=1, driver="agent", method="dense")
    episode |= dict(scope="prefill_only", protocol="true_eviction", seed=0, status="submitted", created_at=NOW)
    episode |= dict(n_claims=1, config={}, finished_at=NOW)
    with engine.begin() as conn:
        conn.execute(tables["jobs"].insert(), [dict(id="j1", created_at=NOW, updated_at=NOW, status="running",
                     config={}, config_hash="0" * 64, package_versions={}, counts={})])  # fmt: skip
        conn.execute(tables["episodes"].insert(), [episode])
        conn.execute(tables["workers"].insert(), [WORKER])
    engine.dispose()
    with pytest.raises(IntegrityError):  # 0011 refuses the word
        _set_gone(url)
    (before,), workers = _rows(url, "episodes"), _rows(url, "workers")

    command.upgrade(_alembic_config(url), "0012")  # to 0012 itself: later revisions add columns of their own
    (after,) = _rows(url, "episodes")
    assert after.pop("grade_sent_at") is None and after == before
    assert _rows(url, "workers") == workers
    _set_gone(url)
    assert _rows(url, "workers")[0]["state"] == "gone"

    command.downgrade(_alembic_config(url), "0011")
    assert _rows(url, "episodes") == [before]
    assert _rows(url, "workers") == workers  # gone reads ok again, as a dead worker's row did before
    with pytest.raises(IntegrityError):
        _set_gone(url)
