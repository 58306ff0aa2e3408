"""Database fixtures for the service tests: a fresh SQLite file, or a throw-away PostgreSQL database.

Import the fixtures into a test module (``from tests.service.db_fixtures import pg_db, sqlite_db``) or
from the area's conftest. PostgreSQL comes from ``$NEXUS_TEST_PG_URL`` (default
``postgresql+psycopg://nexus:nexus@127.0.0.1:5432/nexus_test``, started by .ci/parts/30-services.sh); each
test gets its own database ``<name>_<random>``, migrated to head, dropped afterwards.
"""

from __future__ import annotations

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


@pytest.fixture
def sqlite_db(tmp_path) -> Iterator[Database]:
    db = connect(sqlite_url(tmp_path / "nexus-eval.db"))
    yield db
    db.dispose()


@pytest.fixture
def pg_db() -> Iterator[Database]:
    url, drop = make_pg_database()
    db = connect(url)
    try:
        yield db
    finally:
        db.dispose()
        drop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def any_db(request, tmp_path) -> Iterator[Database]:
    """Both backends: SQLite always, PostgreSQL under the ``services`` marker."""
    if request.param == "sqlite":
        db = connect(sqlite_url(tmp_path / "nexus-eval.db"))
        yield db
        db.dispose()
        return
    url, drop = make_pg_database()
    db = connect(url)
    try:
        yield db
    finally:
        db.dispose()
        drop()
