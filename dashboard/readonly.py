"""Read-only access to the results database for the dashboard's page handlers.

Pages only read, so they get an engine the database itself holds to that: SQLite opened as a URI with
``mode=ro`` (a write raises "attempt to write a readonly database"), PostgreSQL with every transaction
read-only (``default_transaction_read_only``). A bug in a page handler can then never change results, and a
viewer can point the dashboard at a database it may only read. Nothing here migrates: a missing database or
an older schema is a clear error at startup (:class:`DatabaseUnavailable`, ``db.availability``'s words); the write
actions (cancel, rerun) open a read-write ``db.availability.open_existing`` instead, which never migrates either.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from db.availability import DatabaseUnavailable, missing_message
from db.availability import check_schema as check_schema_at
from db.connection import SQLITE_BUSY_TIMEOUT_MS
from db.urls import masked

__all__ = ["DatabaseUnavailable", "check_schema", "open_readonly", "readonly_engine"]


def readonly_engine(url: str) -> Engine:
    """An engine over ``url`` that cannot write: SQLite ``mode=ro`` URI, PostgreSQL read-only transactions."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = parsed.database or ""
        if path in ("", ":memory:"):
            raise DatabaseUnavailable(f"in-memory SQLite ({masked(url)!r}) has no results to show; give a file")
        if not Path(path).is_file():
            raise DatabaseUnavailable(missing_message(url))
        # SQLAlchemy hands the "database" to sqlite3.connect(..., uri=True) as is; the path is %-quoted for URI
        uri = "file:" + quote(str(Path(path).resolve()))
        engine = create_engine(URL.create("sqlite", database=uri, query={"mode": "ro", "uri": "true"}))

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA query_only = ON")  # belt and braces: refused even if the URI flag were lost
            cursor.close()

        return engine
    if backend == "postgresql":
        if parsed.get_driver_name() == "":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(
            parsed, pool_pre_ping=True, connect_args={"options": "-c default_transaction_read_only=on"}
        )
    raise DatabaseUnavailable(f"unsupported database URL {masked(url)!r}: use a SQLite file or postgresql+psycopg://")


def check_schema(engine: Engine, url: str | None = None) -> None:
    """Raise :class:`DatabaseUnavailable` unless the database holds the results schema at the newest revision
    (``db.availability.check_schema``; its messages name ``url``, default the engine's, with the password masked).

    Reading an older schema would fail page by page on the first missing column; saying so once at startup,
    with the fix, is kinder."""
    check_schema_at(engine, url or engine.url.render_as_string(hide_password=False))


def open_readonly(url: str) -> sessionmaker[Session]:
    """A session factory over a read-only engine for ``url``, after :func:`check_schema`."""
    engine = readonly_engine(url)
    try:
        check_schema(engine, url)
    except DatabaseUnavailable:
        engine.dispose()
        raise
    return sessionmaker(engine, expire_on_commit=False)
