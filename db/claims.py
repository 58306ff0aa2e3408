"""Idempotent episode execution: claim, heartbeat, record turns; finishing and grading are :mod:`db.finishing`.

The contract that makes a redelivered Celery message harmless:

1. ``claim_episode`` moves ``queued -> running`` (or takes over a ``running`` row whose worker is dead or
   whose heartbeat is stale) with a compare-and-swap UPDATE on ``(status, claim_token)``, and hands back a
   :class:`Claim` holding a fresh random token. Of two racing workers exactly one gets a Claim; the other
   gets ``None`` and must drop the message.
2. Every later write (``record_turn``, ``heartbeat``, ``db.finishing.finish_episode``) is conditional on
   ``status = 'running' AND claim_token = <token>``. A worker whose claim was taken over, cancelled or
   already finished cannot write: ``record_turn``/``heartbeat`` raise :class:`ClaimLost`,
   ``finish_episode`` returns ``False``. So an episode row gets exactly one result.
3. ``db.finishing.record_grade`` writes a verdict only over an agent exit status (``submitted``, ``step_limit``
   ...), so a redelivered grade task is a no-op; ``regrade=True`` overwrites on purpose.

A takeover deletes the dead run's partial turns (the new run starts from turn 0); ``n_claims`` counts the
claims, so ``n_claims > 1`` shows that a takeover happened.

Transactions: each function does its writes in the caller's session and does not commit; use one
``with db.session() as s:`` per call so the commit happens right after (the row locks are short). Every writer
takes the job's lock before an episode's (:func:`lock_job`, :func:`lock_episode_job`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from db.connection import begin_write
from db.job_status import refresh_job_status
from db.models import (
    AGENT_EXIT_STATUSES,
    AttemptDriver,
    Episode,
    EpisodeStatus,
    Job,
    JobStatus,
    Turn,
    utcnow,
)
from db.process_identity import local_worker_is_dead, worker_identity

#: the statuses in which a claim holds a row: a run, or the grading of an agent exit
HELD_STATUSES = ("running", *sorted(AGENT_EXIT_STATUSES))
TURN_FIELDS = frozenset(c.name for c in Turn.__table__.columns) - {"id", "episode_id", "index", "created_at"}


class ClaimLost(RuntimeError):
    """The claim no longer holds: the episode was cancelled, taken over, or already finished."""


@dataclass(frozen=True)
class Claim:
    """Proof that this worker owns a running episode. Pass it to every later write."""

    episode_id: str
    job_id: str
    token: str
    worker: str
    attempt: int
    celery_task_id: str | None = None
    took_over_from: str | None = None  # the dead/stale worker whose run this claim replaced


def expire_loaded(session: Session, episode_ids: set[str] | None = None) -> None:
    """Expire loaded ``Episode`` objects (all, or those in ``episode_ids``) after a Core UPDATE changed their
    rows, so the next attribute access in this session reads the new values instead of stale ones."""
    for obj in list(session.identity_map.values()):
        if isinstance(obj, Episode) and (episode_ids is None or obj.id in episode_ids):
            session.expire(obj)


def lock_job(session: Session, job_id: str) -> Job:
    """Lock the job row (PostgreSQL ``FOR UPDATE``; SQLite's write lock covers it): every writer takes the
    job lock before an episode lock, so concurrent claims and finishes cannot deadlock and the job-status
    refresh sees the other writers' committed rows."""
    query = select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    return session.execute(query).scalar_one()


def lock_episode_job(session: Session, episode_id: str) -> Job:
    """Start the write and lock the job of ``episode_id`` (`lock_job`: the job lock comes before the episode's);
    ``LookupError`` when there is no such episode."""
    begin_write(session)
    job_id = session.execute(select(Episode.job_id).where(Episode.id == episode_id)).scalar_one_or_none()
    if job_id is None:
        raise LookupError(f"no episode {episode_id!r}")
    return lock_job(session, job_id)


def claim_episode(
    session: Session,
    episode_id: str,
    *,
    worker: str | None = None,
    celery_task_id: str | None = None,
    stale_after_s: float | None = None,
    is_dead: Callable[[str], bool] = local_worker_is_dead,
    now: datetime | None = None,
) -> Claim | None:
    """Claim ``episode_id`` for ``worker`` (default: this process). Returns ``None`` when someone else
    holds it, it is already finished, or its job was cancelled; raises ``LookupError`` if it does not exist.

    A ``running`` episode is taken over when ``is_dead(its worker)`` or its heartbeat is older than
    ``stale_after_s`` (pick a value well above the longest gap between turns).
    """
    job = lock_episode_job(session, episode_id)
    job_id = job.id
    worker = worker or worker_identity()
    now = now or utcnow()
    row = session.execute(
        select(Episode).where(Episode.id == episode_id).execution_options(populate_existing=True)
    ).scalar_one()
    if job.status == JobStatus.cancelled:
        return None
    took_over_from = None
    if row.status == EpisodeStatus.running:
        stale = (
            stale_after_s is not None
            and row.heartbeat_at is not None
            and now - row.heartbeat_at > timedelta(seconds=stale_after_s)
        )
        if not (stale or (row.worker is not None and is_dead(row.worker))):
            return None
        took_over_from = row.worker or "?"
    elif row.status != EpisodeStatus.queued:
        return None
    elif row.n_claims and row.worker is not None:  # handed back by db.liveness.release: a takeover too
        took_over_from = row.worker

    token, before = uuid.uuid4().hex, row.status
    swapped = session.execute(
        update(Episode)
        .where(
            Episode.id == episode_id,
            Episode.status == row.status,
            Episode.claim_token.is_(None) if row.claim_token is None else Episode.claim_token == row.claim_token,
        )
        .values(
            status=EpisodeStatus.running.value,
            worker=worker,
            claim_token=token,
            celery_task_id=celery_task_id or row.celery_task_id,
            started_at=now,
            heartbeat_at=now,
            n_claims=Episode.n_claims + 1,
            taken_by=None,  # the message it came in is no longer only taken: it is claimed (db.taken_messages)
            taken_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    if swapped.rowcount != 1:
        return None
    expire_loaded(session, {episode_id})
    if took_over_from is not None:
        session.execute(delete(Turn).where(Turn.episode_id == episode_id))
    refresh_job_status(session, job_id, moved=[(episode_id, before, EpisodeStatus.running.value)])
    return Claim(
        episode_id=episode_id,
        job_id=job_id,
        token=token,
        worker=worker,
        attempt=row.attempt,
        celery_task_id=celery_task_id or row.celery_task_id,
        took_over_from=took_over_from,
    )


def _touch(session: Session, claim: Claim, now: datetime) -> None:
    touched = session.execute(
        update(Episode)
        .where(Episode.id == claim.episode_id, Episode.status.in_(HELD_STATUSES), Episode.claim_token == claim.token)
        .values(heartbeat_at=now)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {claim.episode_id})
    if touched.rowcount != 1:
        raise ClaimLost(f"episode {claim.episode_id}: claim {claim.token[:8]} by {claim.worker} no longer holds")


def heartbeat(session: Session, claim: Claim) -> None:
    """Mark the claim (a run's, or a grade's from ``db.liveness.claim_grade``) alive; ``workers.faults.heartbeat``
    calls it every few seconds while the episode is held. Raises :class:`ClaimLost` if it no longer holds."""
    begin_write(session)
    _touch(session, claim, utcnow())


def record_turn(session: Session, claim: Claim, index: int, *, steered: bool = False, **fields: Any) -> Turn:
    """Store one turn (0-based ``index``) and refresh the heartbeat. ``fields`` are Turn columns
    (``tokens_generated``, ``physical_before`` as ``{"min","mean","max"}``, ``completion``, ``action`` ...).
    ``steered``: an operator changed this turn (``TurnRecord.steered``: replaced or skipped its action, stopped
    the run, opened a shell in the container, or a forced turn repeated such an act); the attempt's driver becomes
    ``steered``.

    Raises :class:`ClaimLost` if the claim no longer holds (stop the episode then: it was cancelled or
    taken over), ``TypeError`` for an unknown field.
    """
    unknown = sorted(set(fields) - TURN_FIELDS)
    if unknown:
        raise TypeError(f"record_turn: unknown turn field(s) {unknown}; known: {sorted(TURN_FIELDS)}")
    begin_write(session)
    if steered:
        lock_job(session, claim.job_id)  # the job lock first, like every writer: the driver moves the counts
    now = utcnow()
    _touch(session, claim, now)
    turn = Turn(episode_id=claim.episode_id, index=index, created_at=now, **fields)
    session.add(turn)
    if steered:  # an operator changed this turn: the attempt is steered
        mark_steered(session, claim.job_id, claim.episode_id)
    session.flush()
    return turn


def mark_steered(session: Session, job_id: str, episode_id: str) -> None:
    """The attempt's driver becomes ``steered`` (an operator changed what its agent saw or its container holds),
    and the job's counts move it from the interactive attempts to the steered ones. The caller holds the job's
    lock (:func:`lock_job`)."""
    driver = session.execute(select(Episode.driver).where(Episode.id == episode_id)).scalar_one()
    if driver == AttemptDriver.steered.value:
        return
    session.execute(update(Episode).where(Episode.id == episode_id).values(driver=AttemptDriver.steered.value))
    refresh_job_status(session, job_id, driver_was={episode_id: driver})
