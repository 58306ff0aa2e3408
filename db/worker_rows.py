"""The ``workers`` table: each worker process's own report, and the workers that are gone.

Every worker's sweeper writes its row each sweep (:func:`report_worker`: ``ok``, or ``paused`` while the Docker engine
does not answer) and marks ``gone`` the rows of workers that stopped writing theirs (:func:`mark_gone_workers`: the
process or its host died; ``jobs.settings.Liveness.worker_gone_after_s``). ``doctor``, ``status`` and the dashboard
list them (:func:`recent_workers`). Functions write in the caller's session and do not commit.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from db.models import WorkerRow, WorkerState, utcnow


def report_worker(
    session: Session, name: str, *, queues: str, state: str, detail: str | None = None, now: datetime | None = None
) -> WorkerRow:
    """Insert or update a worker's own row (``state``: ``ok`` or ``paused``; a row marked ``gone`` comes back)."""
    now = now or utcnow()
    state = WorkerState(state).value
    row = session.get(WorkerRow, name, populate_existing=True)
    if row is None:
        row = WorkerRow(name=name, queues=queues, state=state, started_at=now, seen_at=now, state_since=now)
        session.add(row)
    else:
        if row.state != state:
            row.state_since = now
        row.queues, row.state, row.seen_at = queues, state, now
    row.detail = detail
    session.flush()
    return row


def mark_gone_workers(session: Session, *, silent_s: float, now: datetime | None = None) -> list[str]:
    """Mark ``gone`` every worker whose row was last written more than ``silent_s`` seconds ago (its sweeper writes
    it every sweep: the process, or its host, is gone). Returns their names. A worker that reports again is set
    back by :func:`report_worker`."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=silent_s)
    stale = WorkerRow.seen_at < cutoff, WorkerRow.state != WorkerState.gone.value
    names = list(session.execute(select(WorkerRow.name).where(*stale)).scalars())
    if names:
        detail = f"no report for over {silent_s:g} s (the process or its host is gone)"
        session.execute(
            update(WorkerRow)
            .where(WorkerRow.name.in_(names), *stale)
            .values(state=WorkerState.gone.value, state_since=now, detail=detail)
            .execution_options(synchronize_session=False)
        )
    return names


#: how long a worker marked gone is still listed (``status``, ``doctor``, the dashboard); its row stays in the table
GONE_LISTED_S = 3600.0


def recent_workers(
    session: Session, *, within_s: float, now: datetime | None = None, gone_within_s: float = 0.0
) -> list[WorkerRow]:
    """Workers that reported within ``within_s`` seconds, and (``gone_within_s``) those marked gone within that
    many seconds, newest report first."""
    now = now or utcnow()
    listed = WorkerRow.seen_at >= now - timedelta(seconds=within_s)
    if gone_within_s > 0:
        went = (WorkerRow.state == WorkerState.gone.value) & (
            WorkerRow.state_since >= now - timedelta(seconds=gone_within_s)
        )
        listed = or_(listed, went)
    query = select(WorkerRow).where(listed).order_by(WorkerRow.seen_at.desc())
    return list(session.execute(query).scalars())
