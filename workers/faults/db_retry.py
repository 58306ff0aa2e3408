"""Riding out a database outage: retry a unit of database work with backoff for a bounded time.

A worker must never acknowledge a message whose episode it could not record: a PostgreSQL restart of a few
seconds would otherwise leave ``queued`` rows that no message will ever start. Every database call of an
episode's life (claim, turn, finish, grade, the failure handler's own write) goes through :func:`retrying`;
when the budget is spent it raises :class:`DatabaseStillDown`, and the Celery task requeues its message
(``workers.celery_tasks``) so the episode runs later.

Only connection-level errors are retried (``OperationalError``, ``InterfaceError``, a DBAPI error that
invalidated its connection); a constraint violation or a bug is raised at once. Each call must be one whole
transaction (``with db.session() as s: ...``), so a retry repeats it from the start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

log = logging.getLogger(__name__)
T = TypeVar("T")


class DatabaseStillDown(RuntimeError):
    """The database did not answer within the retry budget; ``__cause__`` is its last error."""


def is_transient(exc: BaseException) -> bool:
    """A database error that another try may not hit: the connection, not the statement."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def retrying(
    work: Callable[[], T],
    *,
    budget_s: float,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``work()``, tried again after a transient database error (backoff 0.5 s doubling to 10 s) until
    ``budget_s`` seconds have passed; then :class:`DatabaseStillDown`. ``what`` names the work in logs."""
    deadline, wait, tries = clock() + budget_s, 0.5, 0
    while True:
        tries += 1
        try:
            result = work()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if clock() + wait > deadline:
                raise DatabaseStillDown(
                    f"{what}: the database did not answer for {budget_s:.0f} s ({tries} tries): "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                ) from exc
            if tries == 1:
                log.warning(
                    "%s: database unreachable (%s); retrying for up to %.0f s", what, type(exc).__name__, budget_s
                )
            sleep(wait)
            wait = min(wait * 2, 10.0)
            continue
        if tries > 1:
            log.warning("%s: database back after %d tries", what, tries)
        return result
