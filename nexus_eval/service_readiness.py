"""The readiness checks of the service's shared state: the broker, the database and the workers that report to it.

Every check returns a `Check` (`nexus_eval.readiness_check`) and never raises; a row that shows a URL masks its
password (``db.urls.masked``). Heavy imports stay inside the functions.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from nexus_eval.readiness_check import SETUP, Check


def broker_check(url: str | None, *, required: bool = True) -> Check:
    """The embedded SQLite broker needs nothing; a Redis broker must answer a PING within 2 s. (`doctor` passes
    ``required=False``: `run` always uses the embedded broker; `submit` and `worker` need this one.) The row
    shows the URL with its password masked (``db.urls.masked``)."""
    if not url:
        return Check("broker", True, required, "embedded SQLite broker beside the database ($NEXUS_EVAL_BROKER unset)")
    from db.urls import masked

    shown = masked(url)
    if not url.startswith(("redis://", "rediss://")):
        return Check("broker", True, required, f"{shown}: not checked (only redis:// brokers are)")
    import redis

    fix = "start Redis there (e.g. `docker compose up -d redis`), or unset NEXUS_EVAL_BROKER and use `nexus-eval run`"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as exc:  # redis raises ConnectionError, TimeoutError, AuthenticationError, ...
        said = str(exc).replace(url, shown)
        detail = f"Redis at {shown} does not answer: {said}" + ("" if required else " (submit and worker need it)")
        return Check("broker", False, required, detail, fix)
    return Check("broker", True, required, f"Redis at {shown} answers")


def settings_broker_check(db_url: str) -> Check:
    """`doctor`'s broker row: the broker of this environment's service settings (``jobs.settings.ServiceSettings``,
    the one reader of ``$NEXUS_EVAL_BROKER``), optional; a bad ``NEXUS_EVAL_*`` variable is named instead."""
    from jobs.settings import ServiceSettings

    try:
        settings = ServiceSettings.from_env(db_url=db_url)
    except ValueError as exc:
        fix = "correct or unset the NEXUS_EVAL_* variable it names (docs/service.md)"
        return Check("broker", False, False, f"service settings: {exc}", fix)
    return broker_check(settings.broker_url, required=False)


def database_check(url: str) -> Check:
    """Reachable, and at a schema revision this version knows (older ones migrate on first use). A SQLite
    file that does not exist yet is fine if its folder can be created: nothing is written here."""
    return database_and_reader(url)[0]


def database_and_reader(url: str) -> tuple[Check, str | None]:
    """:func:`database_check`'s row, and the URL to read the database by when it answers with its schema at
    head (``None`` otherwise: then :func:`workers_check` has nothing to read)."""
    from sqlalchemy.engine import make_url

    from db.availability import refusal
    from db.connection import MIGRATIONS_DIR, current_revision, head_revision
    from db.urls import masked

    fix = "set NEXUS_EVAL_DB (or --db) to a writable SQLite path or a reachable postgresql+psycopg:// URL"
    readable = url
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            path = Path(parsed.database or "")
            if not parsed.database or not path.exists():
                folder = next(p for p in [path.parent, *path.parent.parents] if p.exists())
                if not folder.is_dir() or not os.access(folder, os.W_OK):
                    return Check("database", False, True, f"{path}: cannot create it in {folder}", fix), None
                return Check("database", True, True, f"{path} (created on first use)"), None
        elif "connect_timeout" not in parsed.query:
            parsed = parsed.update_query_dict({"connect_timeout": "3"})
        readable = parsed.render_as_string(hide_password=False)
        revision = current_revision(readable)
    except Exception as exc:  # any driver error means "not reachable"; the message says which
        # the same line every verb prints for a database that is down or missing (db.availability.refusal); a parse
        # or driver error may quote the URL it was given: never with its password
        said = str(refusal(url, exc)).replace(readable, masked(readable))
        return Check("database", False, True, said, fix), None
    head = head_revision()
    if revision == head:
        return Check("database", True, True, f"{masked(url)} (schema at {head})"), readable
    from alembic.script import ScriptDirectory

    if revision is not None and revision not in {
        s.revision for s in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()
    }:
        detail = f"{masked(url)}: schema revision {revision} is unknown to this version (a newer nexus-eval wrote it)"
        fix = "pip install -e . from a newer checkout, or use another database"
        return Check("database", False, True, detail, fix), None
    return Check("database", True, True, f"{masked(url)} (schema {revision or 'empty'} -> {head} on first use)"), None


def sweep_window_s() -> float:
    """How far back a worker counts as present: 3 sweeps, each ``$NEXUS_EVAL_SWEEP`` seconds (the workers'
    setting as this environment sets it; ``workers.faults.heartbeat.LIVENESS.sweep_s`` by default)."""
    from jobs.settings import LIVENESS, ServiceSettings

    try:
        return 3 * ServiceSettings.from_env().sweep_s
    except ValueError:  # a bad NEXUS_EVAL_* variable: the commands that use it say so
        return 3 * LIVENESS.sweep_s


def workers_check(db_url: str, *, within_s: float | None = None, now: datetime | None = None) -> Check:
    """The workers that reported to the database at ``db_url`` in the last ``within_s`` seconds (default
    :func:`sweep_window_s`). Optional: `run` starts its own worker; a paused one (its host's Docker engine does
    not answer, so it takes no episode) makes the row fail."""
    return workers_after_database(*database_and_reader(db_url), within_s=within_s, now=now)


def workers_after_database(
    database: Check, readable: str | None, *, within_s: float | None, now: datetime | None
) -> Check:
    """:func:`workers_check` after the database row (read only when it answers at head)."""
    within_s = sweep_window_s() if within_s is None else within_s
    start = "start one: `nexus-eval worker` (or `nexus-eval run` runs its own)"
    if not database.ok:
        return Check("workers", False, False, "unknown: the database is not reachable", database.fix)
    if readable is None:  # a SQLite file not made yet, or a schema a worker of this version would have migrated
        return Check("workers", False, False, "none: no worker of this version has used this database", start)
    from sqlalchemy.orm import Session

    from db.connection import make_engine
    from db.models import WorkerState, utcnow
    from db.worker_rows import GONE_LISTED_S, recent_workers

    now = now or utcnow()
    engine = make_engine(readable)
    try:
        with Session(engine) as s:
            listed = recent_workers(s, within_s=within_s, now=now, gone_within_s=GONE_LISTED_S)
            listed = sorted(listed, key=lambda r: r.name)
    except Exception as exc:  # the database went away since its row: say so, never raise
        return Check("workers", False, False, f"cannot read it: {type(exc).__name__}: {exc}".splitlines()[0])
    finally:
        engine.dispose()
    window = f"{within_s:g} s"
    rows = [r for r in listed if r.state != WorkerState.gone]
    gone = "".join(f"; {r.name} gone since {_clock(r.state_since, now)} ({r.queues})" for r in listed if r not in rows)
    if not rows:
        return Check("workers", False, False, f"no worker has reported in the last {window}{gone}", start)
    parts = []
    for r in rows:
        if r.state == WorkerState.paused:
            parts.append(f"{r.name} paused since {_clock(r.state_since, now)} ({r.queues}): {r.detail or '?'}")
        else:
            parts.append(f"{r.name} ok ({r.queues})")
    paused = [r for r in rows if r.state == WorkerState.paused]
    detail = f"{len(rows)} worker{'s' if len(rows) > 1 else ''} seen in the last {window}: " + "; ".join(parts) + gone
    if paused:
        one = len(paused) == 1
        fix = f"start the Docker engine on {'that host' if one else 'their hosts'} (`{SETUP}`); " + (
            "the worker resumes by itself" if one else "the workers resume by themselves"
        )
        return Check("workers", False, False, detail, fix)
    return Check("workers", True, False, detail)


def queue_workers(db_url: str, queue: str, *, within_s: float | None = None, now: datetime | None = None) -> dict:
    """The workers that reported listening on ``queue`` to the database at ``db_url`` in the last ``within_s``
    seconds (default :func:`sweep_window_s`), by state: ``{"ok": [names], "paused": [names]}``; ``None`` when
    the workers table cannot be read. One short SELECT (a PostgreSQL connect gives up after 2 s); never raises."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from db.connection import make_engine
    from db.models import WorkerState, utcnow
    from db.worker_rows import recent_workers

    within_s = sweep_window_s() if within_s is None else within_s
    found: dict = {"ok": [], "paused": []}
    try:
        parsed = make_url(db_url)
        if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
            parsed = parsed.update_query_dict({"connect_timeout": "2"})
        engine = make_engine(parsed.render_as_string(hide_password=False))
        try:
            with Session(engine) as s:
                rows = recent_workers(s, within_s=within_s, now=now or utcnow())
        finally:
            engine.dispose()
    except Exception:  # the caller says "unknown"
        return None
    for row in sorted(rows, key=lambda r: r.name):
        if row.state != WorkerState.gone and queue in [q.strip() for q in (row.queues or "").split(",")]:
            found["paused" if row.state == WorkerState.paused else "ok"].append(row.name)
    return found


def _clock(at: datetime, now: datetime) -> str:
    """``12:01:03 UTC`` today, with the date on another day."""
    return f"{at:%H:%M:%S} UTC" if at.date() == now.date() else f"{at:%Y-%m-%d %H:%M:%S} UTC"
