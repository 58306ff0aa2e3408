"""Opening a database that must already exist: every verb that reads (status, compare, the dashboard, ...).

Only the verbs that store new work (submit, run, a worker, ...) and ``python -m db upgrade`` create or migrate
(``db.connection.connect``). :func:`open_existing` creates nothing (no folder, file or table) and never migrates; a
database it cannot use is refused with a :class:`DatabaseUnavailable` (missing, down, or at another schema) whose
one message names the URL with its password masked and says what to do. The checks are also used one by one: the
CLI's preflight (:func:`check_reachable`), the read-only dashboard engine (:func:`check_schema`) and ``doctor``
(:func:`refusal`), so every place words a refusal the same way.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from db.connection import Database, default_url, known_revisions, make_engine, shipped_head
from db.urls import masked

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
