"""Database fixtures for the service tests: a fresh SQLite file, or a throw-away PostgreSQL database.

Import the fixtures into a test module (``from tests.support.db_fixtures import any_db_fixture``; the
fixture is then requested as ``any_db``) or from the area's conftest. PostgreSQL comes from
``$NEXUS_TEST_PG_URL`` (default ``postgresql+psycopg://nexus:nexus@127.0.0.1:5432/nexus_test``, started by
.ci/parts/30-services.sh); the session gets its own database ``<name>_<random>``, migrated to head once and
dropped at the end; each test starts from empty tables.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from db import Database, connect, sqlite_url
from tests.conftest import require

PG_URL = os.environ.get("NEXUS_TEST_PG_URL", "postgresql+psycopg://nexus:nexus@127.0.0.1:5432/nexus_test")


def pg_available(url: str = PG_URL) -> bool:
    try:
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:  # any failure to reach it means "not available" for require()
        return False


def make_pg_database() -> tuple[str, Callable[[], None]]:
    """Create an empty database next to PG_URL's; returns (url, drop)."""
    require(pg_available(), f"PostgreSQL not reachable at {make_url(PG_URL).render_as_string(hide_password=True)}")
    base = make_url(PG_URL)
    name = f"{base.database}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return base.set(database=name).render_as_string(hide_password=False), drop


_shared_pg: Database | None = None


def shared_pg_database() -> Database:
    """One migrated throw-away database per test session (dropped at exit); tests empty it, not recreate it.

    A module-level cache rather than a session fixture, so modules can import the fixtures below without a
    conftest."""
    global _shared_pg
    if _shared_pg is None:
        url, drop = make_pg_database()
        db = connect(url)

        def close() -> None:
            db.dispose()
            drop()

        atexit.register(close)
        _shared_pg = db
    return _shared_pg


def _emptied(db: Database) -> Database:
    with db.session() as s:
        s.execute(text("TRUNCATE turns, episodes, jobs, probe_runs, workers RESTART IDENTITY CASCADE"))
    return db


@pytest.fixture(name="sqlite_db")
def sqlite_db_fixture(tmp_path) -> Iterator[Database]:
    db = connect(sqlite_url(tmp_path / "nexus-eval.db"))
    yield db
    db.dispose()


@pytest.fixture(name="pg_db")
def pg_db_fixture() -> Database:
    """The session's PostgreSQL database, emptied."""
    return _emptied(shared_pg_database())


@pytest.fixture(name="any_db", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def any_db_fixture(request, tmp_path) -> Iterator[Database]:
    """Both backends: a fresh SQLite file always, the emptied PostgreSQL database under ``services``."""
    if request.param == "sqlite":
        db = connect(sqlite_url(tmp_path / "nexus-eval.db"))
        yield db
        db.dispose()
        return
    yield _emptied(shared_pg_database())
