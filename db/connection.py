"""Opening the database to store new work: URL defaults, engine settings, and migrating to the newest schema.

Users never run ``alembic`` by hand: :func:`connect` (or :func:`migrate`) runs ``alembic upgrade head``
through the Alembic API with the migrations shipped inside this package.

URLs:
- default: ``sqlite:///<abs path>`` where the path is ``$NEXUS_EVAL_DB`` or ``./runs/nexus-eval.db``
  (a bare path in ``NEXUS_EVAL_DB`` is taken as a SQLite file; a URL is used as is);
- PostgreSQL: ``postgresql+psycopg://user:password@host:5432/dbname`` (psycopg 3).

Only the verbs that store new work create or migrate (:func:`connect`); every verb that reads opens the database
with ``db.availability.open_existing``, which creates nothing and refuses a database that is missing, down, or at
another schema.

PostgreSQL connections are held to ``db.session_bounds.SessionBounds``: every one gives up connecting after a timeout
and keeps TCP keepalives on both ends; a worker's (``WORKER_BOUNDS``) also has the server end a session left idle
inside a transaction and cancel a statement that runs too long, so a worker host cut off while it holds the job
lock cannot keep it for longer than that (issue 48).

SQLite is opened in WAL mode with a busy timeout and foreign keys on. Write transactions in
:mod:`db.job_rows`/:mod:`db.store`/:mod:`db.claims` start with ``BEGIN IMMEDIATE`` (see :func:`begin_write`) so
two workers racing for the same episode serialize at the start of the transaction instead of failing on a lock
upgrade halfway through it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from db.session_bounds import CONNECTION_BOUNDS, SessionBounds
from db.urls import masked

DEFAULT_DB_PATH = Path("runs") / "nexus-eval.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
MIGRATION_LOCK_KEY = 0x6E657875  # "nexu": the PostgreSQL advisory lock held while migrating


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """The database URL to use when none is given: ``$NEXUS_EVAL_DB`` (URL or file path; from ``environ``,
    default ``os.environ``) or ./runs/nexus-eval.db."""
    configured = (os.environ if environ is None else environ).get("NEXUS_EVAL_DB", "").strip()
    if "://" in configured:
        return configured
    path = Path(configured) if configured else DEFAULT_DB_PATH
    return sqlite_url(path)


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """``sqlite:///`` URL for a file path, made absolute so it does not depend on the cwd later."""
    return f"sqlite:///{Path(path).expanduser().resolve()}"


def _enable_wal(cursor) -> None:  # type: ignore[no-untyped-def]
    """Switch the file to WAL (readers never block the writer). Switching needs an exclusive lock and
    SQLite does not busy-wait for it, so processes opening a fresh file at once retry here."""
    for attempt in range(100):
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 99:
                raise
            time.sleep(0.05)


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if engine.url.database not in (None, "", ":memory:"):
            _enable_wal(cursor)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str | None = None, *, echo: bool = False, bounds: SessionBounds = CONNECTION_BOUNDS) -> Engine:
    """An Engine for ``url`` (default: :func:`default_url`); creates a SQLite file's parent folder. A PostgreSQL
    engine's connections are held to ``bounds``."""
    url = url or default_url()
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, echo=echo)
        _install_sqlite_hooks(engine)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() not in ("psycopg", ""):
        raise ValueError(
            f"unsupported PostgreSQL driver {parsed.get_driver_name()!r} in {masked(url)!r}: use postgresql+psycopg://"
        )
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(parsed, echo=echo, pool_pre_ping=True, connect_args=bounds.connect_args(parsed))


def begin_write(session: Session) -> None:
    """Start ``session``'s transaction as a write transaction (``BEGIN IMMEDIATE`` on SQLite).

    A no-op when the session's transaction already holds a connection (then it is whatever it began as)
    or the database is not SQLite. Call it before the first statement of a unit of work.
    """
    if session.get_bind().dialect.name != "sqlite":
        return
    transaction = session.get_transaction()
    if transaction is not None and getattr(transaction, "_connections", None):
        return  # already connected: BEGIN was emitted, the mode cannot change now
    session.connection(execution_options={"sqlite_begin": "IMMEDIATE"})


def _alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' is ConfigParser's interpolation character; URLs with %-escaped passwords must survive it.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate(url: str | None = None, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (default: the newest), creating it if needed."""
    from alembic import command

    url = url or default_url()
    engine = make_engine(url)
    try:
        config = _alembic_config(url)
        # Several workers may start at once against a fresh database: serialize their upgrades so the
        # second one finds the schema at head instead of racing to create the same tables.
        with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as connection, connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def current_revision(url: str | None = None) -> str | None:
    """The Alembic revision the database at ``url`` is at (``None`` for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def shipped_head() -> str:
    """The newest revision shipped, from the file names alone (``NNNN_name.py``, revision ``NNNN``; a test holds it
    to Alembic's :func:`head_revision`), so opening an up-to-date database imports no Alembic."""
    names = [p.name.split("_", 1)[0] for p in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")]
    return max(names)


def known_revisions() -> set[str]:
    """Every revision shipped in ``db/migrations/versions`` (from the file names: no Alembic import)."""
    return {p.name.split("_", 1)[0] for p in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")}


def _at_head(engine: Engine) -> bool:
    """Whether the database's ``alembic_version`` already names the shipped head (one SELECT)."""
    try:
        with engine.connect() as connection:
            stored = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except Exception:  # no such table yet (a fresh database), or anything odd: let migrate() decide
        return False
    return stored == [shipped_head()]


def head_revision() -> str:
    """The newest revision shipped in ``db/migrations``."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config("sqlite://")).get_current_head()
    assert head is not None, "db/migrations has no revisions"
    return head


@dataclass
class Database:
    """An engine plus a session factory. Use one short session per unit of work::

        db = connect()
        with db.session() as s:
            job = job_rows.create_job(s, spec_json, config_hash=...)

    ``session()`` commits on success and rolls back on error. Never keep a session open across a model
    call or a container run: on SQLite an open write transaction blocks every other writer.
    """

    url: str
    engine: Engine
    sessions: sessionmaker[Session]

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


def connect(
    url: str | None = None, *, upgrade: bool = True, echo: bool = False, bounds: SessionBounds = CONNECTION_BOUNDS
) -> Database:
    """Open the database at ``url`` (default: :func:`default_url`), migrating it to head first unless
    ``upgrade=False`` (the migration on a connection of its own, without session timeouts). PostgreSQL connections
    are held to ``bounds`` (a worker's: ``db.session_bounds.WORKER_BOUNDS``)."""
    url = url or default_url()
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Every pooled connection would get its own empty in-memory database: nothing would persist.
        raise ValueError(
            f"in-memory SQLite ({masked(url)!r}) is not supported; give a file, e.g. {sqlite_url('nexus-eval.db')}"
        )
    engine = make_engine(url, echo=echo, bounds=bounds)
    if upgrade and not _at_head(engine):
        migrate(url)
    return Database(url=url, engine=engine, sessions=sessionmaker(engine, expire_on_commit=False))
