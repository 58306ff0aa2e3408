"""Opening the database: URL defaults, engine settings, and migrating to the newest schema.

Users never run ``alembic`` by hand: :func:`connect` (or :func:`migrate`) runs ``alembic upgrade head``
through the Alembic API with the migrations shipped inside this package.

URLs:
- default: ``sqlite:///<abs path>`` where the path is ``$NEXUS_EVAL_DB`` or ``./runs/nexus-eval.db``
  (a bare path in ``NEXUS_EVAL_DB`` is taken as a SQLite file; a URL is used as is);
- PostgreSQL: ``postgresql+psycopg://user:password@host:5432/dbname`` (psycopg 3).

Only the verbs that store new work create or migrate (:func:`connect`); every verb that reads opens the database
with :func:`open_existing`, which creates nothing and refuses (:class:`DatabaseUnavailable`, one message naming
the URL with its password masked and what to do) a database that is missing, down, or at another schema.

SQLite is opened in WAL mode with a busy timeout and foreign keys on. Write transactions in
:mod:`db.job_rows`/:mod:`db.store`/:mod:`db.claims` start with ``BEGIN IMMEDIATE`` (see :func:`begin_write`) so
two workers racing for the same episode serialize at the start of the transaction instead of failing on a lock
upgrade halfway through it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

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


def make_engine(url: str | None = None, *, echo: bool = False) -> Engine:
    """An Engine for ``url`` (default: :func:`default_url`); creates a SQLite file's parent folder."""
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
    return create_engine(parsed, echo=echo, pool_pre_ping=True)


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


def connect(url: str | None = None, *, upgrade: bool = True, echo: bool = False) -> Database:
    """Open the database at ``url`` (default: :func:`default_url`), migrating it to head first unless
    ``upgrade=False``."""
    url = url or default_url()
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Every pooled connection would get its own empty in-memory database: nothing would persist.
        raise ValueError(
            f"in-memory SQLite ({masked(url)!r}) is not supported; give a file, e.g. {sqlite_url('nexus-eval.db')}"
        )
    engine = make_engine(url, echo=echo)
    if upgrade and not _at_head(engine):
        migrate(url)
    return Database(url=url, engine=engine, sessions=sessionmaker(engine, expire_on_commit=False))


# Opening a database that must already exist (every verb that reads: status, compare, the dashboard, ...).
# Only the verbs that store new work (submit, run, a worker, ...) and `python -m db upgrade` create or migrate.

#: how to make a database, named by every refusal of a missing one
CREATES = "`nexus-eval run` or `nexus-eval submit` (or `python -m db upgrade URL`)"
#: PostgreSQL's words for a database that is not there (SQLSTATE 3D000, in the connect error's text)
_PG_NO_DATABASE = re.compile(r'database "(?P<name>[^"]*)" does not exist')


class DatabaseUnavailable(RuntimeError):
    """The database cannot be opened as asked. The message names it (password masked) and says what to do."""


class DatabaseMissing(DatabaseUnavailable):
    """No such database: the SQLite file (or the PostgreSQL database) does not exist, or holds no results tables."""


class DatabaseDown(DatabaseUnavailable):
    """The database does not answer: the server is down, refuses the connection, or the file cannot be opened."""


class SchemaMismatch(DatabaseUnavailable):
    """The database is at another schema revision than this nexus-eval reads (older: migrate it; newer: upgrade)."""


def first_cause(exc: BaseException) -> str:
    """The driver's own first words about why ``exc`` happened, in one line (SQLAlchemy's wrapper, its
    "Background on this error" and libpq's hints left out)."""
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip(" \t-") for line in str(orig).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(orig).__name__
    said = lines[0]
    if said.endswith(":") and len(lines) > 1:  # "Multiple connection attempts failed. All failures were:"
        said = f"{said} {lines[1]}"
    return said


def _hide(text: str, url: str) -> str:
    """``text`` with every spelling of ``url`` that carries its password replaced by the masked one."""
    spellings = {url}
    with contextlib.suppress(Exception):  # not a URL SQLAlchemy reads: only the text as given can appear
        spellings.add(make_url(url).render_as_string(hide_password=False))
    for spelled in spellings:
        text = text.replace(spelled, masked(spelled))
    return text


def unreachable_message(url: str, exc: BaseException) -> str:
    """One line for a database that does not answer: the masked URL and the driver's first cause."""
    return f"cannot connect to the database {masked(url)}: {_hide(first_cause(exc), url)}"


def missing_message(url: str) -> str:
    """What every reading verb says when the database at ``url`` does not exist (and that it created nothing)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        name = parsed.database or "?"
        return (
            f'the database "{name}" does not exist on {masked(url)} (nothing was created): create it '
            f"(`createdb {name}`), then {CREATES} makes its tables"
        )
    return (
        f"no results database at {parsed.database} (nothing was created): {CREATES} creates one; or point --db "
        "(or $NEXUS_EVAL_DB) at an existing one"
    )


def known_revisions() -> set[str]:
    """Every revision shipped in ``db/migrations/versions`` (from the file names: no Alembic import)."""
    return {p.name.split("_", 1)[0] for p in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")}


def schema_message(url: str, revision: str | None) -> str:
    """Why a reading verb refuses the database at ``url``, at schema ``revision`` (not the shipped head)."""
    shown, head = masked(url), shipped_head()
    if revision is None:
        return f"{shown} has no results tables yet (nothing was created): {CREATES} creates them"
    if revision not in known_revisions():
        return (
            f"{shown} is at schema revision {revision}, newer than this nexus-eval reads ({head}): use a newer "
            "nexus-eval (`pip install -e .` from a newer checkout)"
        )
    return (
        f"{shown} is at schema revision {revision}, this nexus-eval reads {head}, and reading never migrates: "
        "`python -m db upgrade URL` upgrades it (so does `nexus-eval submit`, `run` or `worker` of this version; "
        "stop older workers that use it first)"
    )


def stored_revision(engine: Engine) -> str | None:
    """The revision ``alembic_version`` names (``None``: no such table, an empty database). Raises the driver's
    error when the database does not answer."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        stored = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return ",".join(stored) or None


def check_schema(engine: Engine, url: str) -> None:
    """Raise :class:`DatabaseUnavailable` unless ``engine`` (over ``url``, which the messages name masked) answers
    with the results schema at the shipped head. One connection, one SELECT; imports no Alembic."""
    try:
        revision = stored_revision(engine)
    except Exception as exc:  # any driver error
        raise refusal(url, exc) from None
    if revision != shipped_head():
        raise (DatabaseMissing if revision is None else SchemaMismatch)(schema_message(url, revision))


def refusal(url: str, exc: BaseException) -> DatabaseUnavailable:
    """The refusal for a driver error met while connecting to ``url``: missing (PostgreSQL's "database ... does not
    exist") or down (anything else: the server is down, refuses us, the file is not a database)."""
    if url.startswith("postgresql") and _PG_NO_DATABASE.search(str(exc)):
        return DatabaseMissing(missing_message(url))
    return DatabaseDown(unreachable_message(url, exc))


def _engine(url: str, *, echo: bool = False) -> Engine:
    try:
        return make_engine(url, echo=echo)
    except ValueError as exc:  # an unsupported driver: its message names the masked URL
        raise DatabaseDown(str(exc)) from None


def require_existing(url: str) -> None:
    """Raise :class:`DatabaseMissing` when ``url`` names a SQLite file that does not exist (or in-memory SQLite),
    before anything could create it."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    if parsed.database in (None, "", ":memory:"):
        raise DatabaseMissing(f"in-memory SQLite ({masked(url)!r}) holds no results; give a file")
    if not Path(parsed.database).is_file():
        raise DatabaseMissing(missing_message(url))
    if Path(parsed.database).stat().st_size == 0:  # opening it would write SQLite's header (WAL mode) into it
        raise DatabaseMissing(schema_message(url, None))


def check_reachable(url: str) -> None:
    """Raise :class:`DatabaseDown` (or :class:`DatabaseMissing`: a PostgreSQL database that is not there) unless a
    connection to ``url`` opens; a SQLite file that does not exist yet is left alone (a writer creates it)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not (parsed.database and Path(parsed.database).is_file()):
        return
    engine = _engine(url)
    try:
        with engine.connect():
            pass
    except Exception as exc:  # any driver error
        raise refusal(url, exc) from None
    finally:
        engine.dispose()


def open_existing(url: str | None = None, *, echo: bool = False) -> Database:
    """Open the database at ``url`` (default: :func:`default_url`) for a verb that reads (and perhaps changes rows
    of) what is stored: it never creates a file, a folder or a table and never migrates. Raises
    :class:`DatabaseMissing` (no such file or database, or no results tables), :class:`DatabaseDown` (it does not
    answer) or :class:`SchemaMismatch` (another schema revision), each with a message that says what to do."""
    url = url or default_url()
    require_existing(url)
    engine = _engine(url, echo=echo)  # a SQLite file's folder exists: nothing is made
    try:
        check_schema(engine, url)
    except DatabaseUnavailable:
        engine.dispose()
        raise
    return Database(url=url, engine=engine, sessions=sessionmaker(engine, expire_on_commit=False))
