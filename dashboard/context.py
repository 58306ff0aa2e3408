"""What the dashboard's routes share: the read-only sessions, the lazily opened read-write database, and
turning a bad job, episode or probe run id into a 404 (:class:`NotFound`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker


class NotFound(Exception):
    """A job, episode or probe run id that names nothing (or an ambiguous prefix); ``what`` says which."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass
class Context:
    """What the routes share: the read-only sessions and, opened on the first write, the read-write database."""

    db_url: str
    sessions: sessionmaker[Session]
    celery_factory: Callable[[], Any]
    _database: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    def dispose(self) -> None:
        """Close every connection (the read-only pool, and the read-write database if a write opened it)."""
        self.sessions.kw["bind"].dispose()
        if self._database is not None:
            self._database.dispose()

    def database(self) -> Any:
        from db.availability import open_existing

        with self._lock:
            if self._database is None:  # never creates or migrates: `serve` found it at head at startup
                self._database = open_existing(self.db_url)
            return self._database


def job_id_of(ctx: Context, job_id: str) -> str:
    """The full id of a job id or unique prefix; :class:`NotFound` otherwise."""
    from db import job_rows

    return _full_id(ctx, job_rows.get_job, job_id)


def episode_id_of(ctx: Context, episode_id: str) -> str:
    """The full id of an episode id or unique prefix; :class:`NotFound` otherwise."""
    from db import store as db_store

    return _full_id(ctx, db_store.get_episode, episode_id)


def probe_run_id_of(ctx: Context, run_id: str) -> str:
    """The full id of a probe run id or unique prefix; :class:`NotFound` otherwise."""
    from db.probes import get_probe_run

    return _full_id(ctx, get_probe_run, run_id)


def _full_id(ctx: Context, get: Callable[[Session, str], Any], ident: str) -> str:
    # only the lookup's LookupError means "not found": a KeyError from a later bug must stay a 500
    with ctx.read() as s:
        try:
            return get(s, ident).id
        except LookupError as exc:
            raise NotFound(str(exc)) from None
