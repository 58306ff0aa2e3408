"""Who still holds an episode, and handing back the ones whose holder is gone.

An episode is *held* while a worker runs it (``running``, under its run claim, see :mod:`db.claims`) or grades
it (an agent exit such as ``submitted`` with ``claim_token`` set: a grade claim). The holder beats
``heartbeat_at`` every few seconds from a thread of its own (``workers.faults.heartbeat``), whatever the episode
is doing. A holder is **gone** when its heartbeat is older than ``stale_after_s`` or, seen from the same kernel boot
and pid namespace (``db.process_identity``), its process no longer exists. Then:

- a run is :func:`release`-d: the row goes back to ``queued`` with its claim cleared (the gone worker can no
  longer write) and its partial turns deleted, and the caller sends it again;
- a grade claim is :func:`release`-d too: the row stays an agent exit with no grade in progress, and the
  caller sends its grade again.

Both are compare-and-swap UPDATEs, so of several sweepers only one hands an episode back. :func:`unsent` lists
what a broker may have lost without anyone holding it (``queued`` rows, agent exits waiting for a grade that
nobody has started): ``nexus-eval resume`` and the embedded worker at start send those again; a duplicate
message finds no claim and does nothing.

The ``workers`` table (each worker's own report, and who is gone) is :mod:`db.worker_rows`. Like :mod:`db.claims`,
functions write in the caller's session and do not commit.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from db.claims import Claim, expire_loaded, lock_job
from db.connection import begin_write
from db.finishing import turn_totals
from db.job_status import job_grades, refresh_job_status
from db.models import (
    AGENT_EXIT_STATUSES,
    Episode,
    EpisodeStatus,
    Job,
    JobStatus,
    Turn,
    is_interactive,
    utcnow,
)
from db.process_identity import local_worker_is_dead, worker_identity

IsDead = Callable[[str], bool]


def holder_gone(row: Episode, *, stale_after_s: float, now: datetime, is_dead: IsDead = local_worker_is_dead) -> bool:
    """Whether the worker holding ``row`` is gone: its process is dead (same host) or its heartbeat is older
    than ``stale_after_s`` (or it never beat)."""
    if row.worker is not None and is_dead(row.worker):
        return True
    return row.heartbeat_at is None or now - row.heartbeat_at > timedelta(seconds=stale_after_s)


def _held(session: Session, job_id: str | None) -> list[Episode]:
    query = (
        select(Episode)
        .join(Job, Job.id == Episode.job_id)
        .where(
            Job.status != JobStatus.cancelled,
            or_(
                Episode.status == EpisodeStatus.running,
                Episode.status.in_(sorted(AGENT_EXIT_STATUSES)) & Episode.claim_token.is_not(None),
            ),
        )
        .execution_options(populate_existing=True)
    )
    if job_id is not None:
        query = query.where(Episode.job_id == job_id)
    return list(session.execute(query).scalars())


def stranded(
    session: Session,
    *,
    stale_after_s: float,
    job_id: str | None = None,
    is_dead: IsDead = local_worker_is_dead,
    now: datetime | None = None,
) -> list[str]:
    """Held episodes (of ``job_id``, or of every job not cancelled) whose holder is gone."""
    now = now or utcnow()
    return [
        r.id for r in _held(session, job_id) if holder_gone(r, stale_after_s=stale_after_s, now=now, is_dead=is_dead)
    ]


def _release(session: Session, episode_id: str, gone: Callable[[Episode], bool], token: str | None = None):
    """Hand back the held row if ``gone(row)`` (and, with ``token``, only that claim's): a run goes back to
    ``queued`` with its partial turns deleted, a grade claim is dropped. Returns (holder, was a run) or None."""
    begin_write(session)
    job_id = session.execute(select(Episode.job_id).where(Episode.id == episode_id)).scalar_one_or_none()
    if job_id is None:
        raise LookupError(f"no episode {episode_id!r}")
    lock_job(session, job_id)
    row = session.execute(
        select(Episode).where(Episode.id == episode_id).execution_options(populate_existing=True)
    ).scalar_one()
    running = row.status == EpisodeStatus.running
    held = (running or row.status in AGENT_EXIT_STATUSES) and row.claim_token is not None
    if not held or (token is not None and row.claim_token != token) or not gone(row):
        return None
    values: dict = {"claim_token": None, "heartbeat_at": None}
    before = row.status  # the row expires below
    ended = running and is_interactive(row.driver)
    if ended:  # no operator is left to drive it: the attempt ends here, its turns kept (never sent to a worker)
        reason = f"the interactive rerun's process {row.worker} is gone; the attempt ended unfinished"
        values.update(turn_totals(session, episode_id), status=EpisodeStatus.infra_failure.value, error=reason)
        values["finished_at"] = utcnow()
    elif running:
        values["status"] = EpisodeStatus.queued.value  # `worker` stays: the next claim reports the takeover
    else:  # the caller sends the grade again now: the sweeper's re-send of unstarted grades waits a bound from here
        values["grade_sent_at"] = utcnow()
    swapped = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, Episode.status == row.status, Episode.claim_token == row.claim_token)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if swapped.rowcount != 1:
        return None
    if running and not ended:
        session.execute(delete(Turn).where(Turn.episode_id == episode_id))  # the next run starts from turn 0
    expire_loaded(session, {episode_id})
    refresh_job_status(session, job_id, moved=[(episode_id, before, values.get("status", before))])
    return Released(row.worker or "?", running, ended)


@dataclass(frozen=True)
class Released:
    """What :func:`release` handed back: the gone ``holder``, whether it was a run (else a grade), and whether
    the attempt was ended instead (an interactive rerun: ``infra_failure``, nothing to send)."""

    holder: str
    run: bool
    ended: bool = False


def release(
    session: Session,
    episode_id: str,
    *,
    stale_after_s: float,
    is_dead: IsDead = local_worker_is_dead,
    now: datetime | None = None,
) -> Released | None:
    """Hand back an episode whose holder is gone: a ``running`` row goes back to ``queued`` (claim void, partial
    turns deleted; an interactive rerun, which no worker may drive, ends as ``infra_failure`` instead), an agent
    exit's grade claim is dropped. ``None`` when it is not stranded (any more): of
    several sweepers only one gets it. Send the run or the grade again after the commit."""
    now = now or utcnow()
    return _release(
        session, episode_id, lambda r: holder_gone(r, stale_after_s=stale_after_s, now=now, is_dead=is_dead)
    )


def give_back(session: Session, claim: Claim) -> bool:
    """Hand back what this worker holds but cannot finish (the database was lost mid-run, the engine went away
    mid-grade): as :func:`release`, for this claim only. ``False`` when the claim no longer holds."""
    return _release(session, claim.episode_id, lambda _r: True, token=claim.token) is not None


def claim_grade(
    session: Session,
    episode_id: str,
    *,
    stale_after_s: float,
    worker: str | None = None,
    is_dead: IsDead = local_worker_is_dead,
    now: datetime | None = None,
) -> Claim | None:
    """Claim the grading of an agent exit: ``None`` when it is not awaiting a grade (graded already: a
    duplicate message) or another grader holds it and is alive. The claim's heartbeat is ``db.claims.heartbeat``."""
    begin_write(session)
    now = now or utcnow()
    row = session.execute(
        select(Episode).where(Episode.id == episode_id).execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        raise LookupError(f"no episode {episode_id!r}")
    if row.status not in AGENT_EXIT_STATUSES:
        return None
    if row.claim_token is not None and not holder_gone(row, stale_after_s=stale_after_s, now=now, is_dead=is_dead):
        return None
    token, worker = uuid.uuid4().hex, worker or worker_identity()
    old_token = Episode.claim_token.is_(None) if row.claim_token is None else Episode.claim_token == row.claim_token
    swapped = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, Episode.status == row.status, old_token)
        .values(claim_token=token, worker=worker, heartbeat_at=now)
        .execution_options(synchronize_session=False)
    )
    if swapped.rowcount != 1:
        return None
    expire_loaded(session, {episode_id})
    return Claim(episode_id=episode_id, job_id=row.job_id, token=token, worker=worker, attempt=row.attempt)


@dataclass
class Unsent:
    """What no one holds and only a message starts: ``queued`` runs and agent exits awaiting a grade."""

    runs: list[str] = field(default_factory=list)
    grades: list[str] = field(default_factory=list)


def unsent(session: Session, job_ids: list[str], *, sent_before: bool = False) -> Unsent:
    """The newest attempts of ``job_ids`` (cancelled jobs left out) that only a message would start. With
    ``sent_before``, only ``queued`` rows a message was once sent for (``celery_task_id``): what a broker may
    have lost, not rows stored and never sent (``resume`` sends those)."""
    from db.store import latest_attempts

    found = Unsent()
    for job in session.execute(select(Job).where(Job.id.in_(job_ids))).scalars():
        if job.status == JobStatus.cancelled:
            continue
        for row in latest_attempts(session, [job.id]):
            if row.status == EpisodeStatus.queued and not is_interactive(row.driver):  # only an operator runs those
                if row.celery_task_id is not None or not sent_before:
                    found.runs.append(row.id)
            elif row.status in AGENT_EXIT_STATUSES and row.claim_token is None and job_grades(job):
                found.grades.append(row.id)
    return found


def due_grades(session: Session, *, after_s: float, now: datetime | None = None) -> list[str]:
    """Agent exits of unfinished jobs that grade, which nobody is grading (no grade claim) and whose grade was
    neither handed off (``finished_at``) nor sent again (``grade_sent_at``) in the last ``after_s`` seconds: a
    grade message the broker may have lost. Oldest first. Send each only if :func:`take_due_grade` gives it."""
    cutoff = (now or utcnow()) - timedelta(seconds=after_s)
    unfinished = select(Job).where(Job.status.not_in([JobStatus.done, JobStatus.cancelled]))
    grading = [job.id for job in session.execute(unfinished).scalars() if job_grades(job)]
    if not grading:
        return []
    query = select(Episode.id).where(Episode.job_id.in_(grading), *_due(cutoff)).order_by(Episode.finished_at)
    return list(session.execute(query).scalars())


def _due(cutoff: datetime) -> tuple:
    """The conditions of an agent exit whose grade is due to be sent again (:func:`due_grades`)."""
    last_sent = or_(
        Episode.grade_sent_at < cutoff,
        Episode.grade_sent_at.is_(None) & or_(Episode.finished_at.is_(None), Episode.finished_at < cutoff),
    )
    return Episode.status.in_(sorted(AGENT_EXIT_STATUSES)), Episode.claim_token.is_(None), last_sent


def take_due_grade(session: Session, episode_id: str, *, after_s: float, now: datetime | None = None) -> bool:
    """Note that ``episode_id``'s grade is being sent again now, if it is still due (:func:`due_grades`): a
    compare-and-swap, so of several sweepers one sends it, once per ``after_s``. ``False``: not due (any more)."""
    now = now or utcnow()
    swapped = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, *_due(now - timedelta(seconds=after_s)))
        .values(grade_sent_at=now)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {episode_id})
    return swapped.rowcount == 1


def unfinished_jobs(session: Session) -> list[str]:
    """Jobs that are neither done nor cancelled (oldest first)."""
    query = select(Job.id).where(Job.status.not_in([JobStatus.done, JobStatus.cancelled])).order_by(Job.created_at)
    return list(session.execute(query).scalars())
