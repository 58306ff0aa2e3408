"""A message taken but not yet claimed: who took the message of a ``queued`` episode, and whether that worker is gone.

An episode task first waits for Docker and only then claims its row (``db.claims.claim_episode``). With late acks on
Redis, a worker (or its host) that dies in between leaves the row ``queued`` with no claim, and its message unacked in
the broker until the visibility timeout (hours): no heartbeat goes silent, so the holders' takeover (``db.liveness``)
never sees it. So the task marks the row first (:func:`note_taken`: ``episodes.taken_by`` / ``taken_at``), and a
sweeper sends the row again when the taker is gone (:func:`gone_takers`, then :func:`take_back`).

The taker is named as the ``workers`` table names a worker: ``hostname/pid/kernel`` (``db.process_identity``) of the
worker's *main* process, whose sweeper writes that row every sweep (a prefork pool process that runs the task is a
child of it; a pool process killed alone gets its message requeued by Celery). It is **gone** when its process is dead
in this pid namespace (``db.process_identity.local_worker_is_dead``: at once), or its row reads ``gone`` or was last
written more than ``Liveness.worker_gone_after_s`` ago; a taker with no row yet (it took a message before its first
sweep) once ``taken_at`` is that old. A worker waiting for Docker is alive: its row reads ``paused``, written each
sweep.

The mark means "the message now in flight for this row was taken by X": the claim clears it (``db.claims``), and so
does every send of the row again (:func:`clear_taken`, before the send). Functions write in the caller's session and do
not commit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, select, update
from sqlalchemy.orm import Session

from db.claims import expire_loaded
from db.connection import begin_write
from db.models import AGENT_DRIVERS, Episode, EpisodeStatus, Job, JobStatus, WorkerRow, WorkerState
from db.process_identity import local_worker_is_dead


@dataclass(frozen=True)
class Taken:
    """A ``queued`` row whose message ``taken_by`` took at ``taken_at``, with that worker's row (None: it has none)."""

    episode_id: str
    taken_by: str
    taken_at: datetime
    worker_state: str | None = None
    worker_seen_at: datetime | None = None


def note_taken(session: Session, episode_id: str, worker_identity: str, now: datetime) -> bool:
    """Mark that ``worker_identity`` (a worker's main process, as its ``workers`` row names it) took the message of
    ``episode_id`` at ``now``, if the row is ``queued``; a row running, finished or cancelled is left alone.
    Whether it was marked."""
    begin_write(session)
    marked = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, Episode.status == EpisodeStatus.queued.value)
        .values(taken_by=worker_identity, taken_at=now)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {episode_id})
    return marked.rowcount == 1


def clear_taken(session: Session, episode_ids: Collection[str], *, taken_by: str | None = None) -> int:
    """Clear the mark of ``episode_ids`` (only ``taken_by``'s, when given): the row is sent again, or its message went
    back to the broker. Returns how many rows it cleared."""
    if not episode_ids:
        return 0
    begin_write(session)
    query = update(Episode).where(Episode.id.in_(list(episode_ids)), Episode.taken_by.is_not(None))
    if taken_by is not None:
        query = query.where(Episode.taken_by == taken_by)
    cleared = session.execute(query.values(taken_by=None, taken_at=None).execution_options(synchronize_session=False))
    expire_loaded(session, set(episode_ids))
    return cleared.rowcount


def taker_gone(
    taken: Taken, *, gone_after_s: float, now: datetime, is_dead: Callable[[str], bool] = local_worker_is_dead
) -> bool:
    """Whether the worker that took ``taken``'s message is gone (see the module docstring)."""
    if is_dead(taken.taken_by):
        return True
    cutoff = now - timedelta(seconds=gone_after_s)
    if taken.worker_state is None or taken.worker_seen_at is None:  # no row of its own yet
        return taken.taken_at < cutoff
    return taken.worker_state == WorkerState.gone.value or taken.worker_seen_at < cutoff


def gone_takers(
    session: Session,
    *,
    gone_after_s: float,
    now: datetime,
    is_dead: Callable[[str], bool] = local_worker_is_dead,
) -> list[Taken]:
    """The ``queued`` rows of unfinished jobs (neither done nor cancelled) that the service runs (not an interactive
    rerun) whose message was taken by a worker that is gone (:func:`taker_gone`), oldest mark first. Send each again
    only if :func:`take_back` gives it."""
    query = marked_rows()
    marked = [Taken(*row) for row in session.execute(query)]
    return [t for t in marked if taker_gone(t, gone_after_s=gone_after_s, now=now, is_dead=is_dead)]


def marked_rows() -> Select:
    """The marked ``queued`` rows of unfinished jobs that the service runs, with their takers' ``workers`` rows, oldest
    mark first: what every sweeper reads each sweep (through the partial index ``ix_episodes_taken``)."""
    return (
        select(Episode.id, Episode.taken_by, Episode.taken_at, WorkerRow.state, WorkerRow.seen_at)
        .join(Job, Job.id == Episode.job_id)
        .outerjoin(WorkerRow, WorkerRow.name == Episode.taken_by)
        .where(
            Episode.status == EpisodeStatus.queued.value,
            Episode.taken_by.is_not(None),
            Episode.driver.in_(sorted(AGENT_DRIVERS)),  # only an operator runs an interactive rerun
            Job.status.not_in([JobStatus.done.value, JobStatus.cancelled.value]),
        )
        .order_by(Episode.taken_at)
    )


def take_back(session: Session, taken: Taken) -> bool:
    """Clear ``taken``'s mark if the row is still ``queued`` and still marked by the same worker: a compare-and-swap,
    so of several sweepers one sends the row again. ``False``: claimed, or taken by another worker, meanwhile."""
    begin_write(session)
    swapped = session.execute(
        update(Episode)
        .where(
            Episode.id == taken.episode_id,
            Episode.status == EpisodeStatus.queued.value,
            Episode.taken_by == taken.taken_by,
        )
        .values(taken_by=None, taken_at=None)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {taken.episode_id})
    return swapped.rowcount == 1


def mark_again(session: Session, taken: Taken) -> None:
    """Put back the mark :func:`take_back` cleared when sending the row failed, unless another worker has taken a
    message of it since: the next sweep tries again."""
    begin_write(session)
    session.execute(
        update(Episode)
        .where(
            Episode.id == taken.episode_id,
            Episode.status == EpisodeStatus.queued.value,
            Episode.taken_by.is_(None),
        )
        .values(taken_by=taken.taken_by, taken_at=taken.taken_at)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {taken.episode_id})
