"""A job's status, derived from the newest attempt of each of its episodes.

``jobs.counts`` holds the number of episode keys per status of their newest attempt. Every writer that changes an
episode's status (claims, finishes, grades, reruns, cancels) holds the job's lock and calls
:func:`refresh_job_status` in the same transaction with what it moved, so the counts and ``jobs.status`` never lag
behind the episodes, and no write or read scans a job's episodes to know them (a finish at 12,800 episodes once
recomputed the whole job: quadratic over the job's life). :func:`recount` is the slow definition the counts must
always equal (``tests/service/test_job_counts.py``); a job without counts (none yet) is recounted once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, exists, func, select
from sqlalchemy.orm import Session, aliased

from db.models import ACTIVE_STATUSES, AGENT_EXIT_STATUSES, Episode, EpisodeStatus, Job, JobStatus


def job_grades(job: Job) -> bool:
    """Whether the job's agent exits (``submitted``, ``step_limit`` ...) still wait for a grade: its config's
    ``grade`` flag (``JobSpec.grade``), on unless the config says otherwise."""
    return bool((job.config or {}).get("grade", True))


@dataclass
class JobSummary:
    """Counts over the newest attempt of each episode key. ``active`` = queued + running (+ agent exits
    waiting for their grade, when the job grades); ``finished`` = the rest."""

    job_id: str
    status: str
    total: int
    counts: dict[str, int] = field(default_factory=dict)  # status -> number of episode keys
    grades: bool = True

    @property
    def awaiting_grade(self) -> int:
        return sum(self.counts.get(s, 0) for s in AGENT_EXIT_STATUSES) if self.grades else 0

    @property
    def active(self) -> int:
        return sum(self.counts.get(s, 0) for s in ACTIVE_STATUSES) + self.awaiting_grade

    @property
    def finished(self) -> int:
        return self.total - self.active


def newest_attempts(job_ids: Sequence[str], *, drivers: Collection[str] | None = None) -> tuple[Any, Any]:
    """(subquery, join condition): each episode key's newest attempt number over ``job_ids`` (among the attempts
    ``drivers`` drove, when given), and the condition that keeps an ``Episode`` row only when it is that attempt."""
    newest = select(Episode.job_id, Episode.episode_key, func.max(Episode.attempt).label("attempt")).where(
        Episode.job_id.in_(list(job_ids))
    )
    if drivers is not None:
        newest = newest.where(Episode.driver.in_(sorted(drivers)))
    newest = newest.group_by(Episode.job_id, Episode.episode_key).subquery()
    is_newest = and_(
        Episode.job_id == newest.c.job_id,
        Episode.episode_key == newest.c.episode_key,
        Episode.attempt == newest.c.attempt,
    )
    return newest, is_newest


def summarize(session: Session, job: Job) -> JobSummary:
    """The counts per status over the newest attempt of each of ``job``'s episode keys."""
    return summarize_jobs(session, [job])[job.id]


def summarize_jobs(session: Session, jobs: Sequence[Job]) -> dict[str, JobSummary]:
    """:func:`summarize` for many jobs (the jobs list), by job id: their stored ``counts`` (one recount for a job
    that has none)."""
    missing = [j.id for j in jobs if j.counts is None]
    recounted = recount_jobs(session, missing) if missing else {}
    out = {}
    for j in jobs:
        counts = {k: v for k, v in (j.counts if j.counts is not None else recounted[j.id]).items() if v}
        out[j.id] = JobSummary(j.id, j.status, sum(counts.values()), counts, job_grades(j))
    return out


def recount(session: Session, job_id: str) -> dict[str, int]:
    """The counts per status over the newest attempt of each of the job's keys, counted from the rows: what
    ``jobs.counts`` must always equal."""
    return recount_jobs(session, [job_id])[job_id]


def recount_jobs(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    if job_ids:
        newest, is_newest = newest_attempts(job_ids)
        query = select(Episode.job_id, Episode.status, func.count()).join(newest, is_newest)
        for job_id, status, n in session.execute(query.group_by(Episode.job_id, Episode.status)):
            counts[job_id][status] += n
    return {j: dict(counts[j]) for j in job_ids}


#: (episode id, its status before, its status after) of a status change a writer made
Move = tuple[str, str, str]


def newest_moves(session: Session, moves: Sequence[Move]) -> Counter[str]:
    """The change in counts per status that ``moves`` make: only a move of its key's newest attempt counts (a grade
    recorded on an attempt that was rerun since changes no count)."""
    delta: Counter[str] = Counter()
    for episode_id, old, new in moves:
        if old == new:
            continue
        newer = aliased(Episode)
        is_newest = session.execute(
            select(Episode.id).where(
                Episode.id == episode_id,
                ~exists().where(
                    newer.job_id == Episode.job_id,
                    newer.episode_key == Episode.episode_key,
                    newer.attempt > Episode.attempt,
                ),
            )
        ).first()
        if is_newest is not None:
            delta[old] -= 1
            delta[new] += 1
    return delta


def refresh_job_status(
    session: Session,
    job_id: str,
    *,
    moved: Sequence[Move] = (),
    delta: Mapping[str, int] | None = None,
    recount_all: bool = False,
) -> str:
    """Bring ``jobs.counts`` up to date with what the caller just changed, in the caller's transaction under the
    job's lock, and store the job's status derived from them (a cancelled job stays cancelled): ``done`` once
    nothing is queued, running or (when the job grades) waiting for a grade. A ``failed`` job (an older version's
    mark for a failed send) is recomputed too: its episodes say where it is.

    ``moved``: the status changes of existing rows (:func:`newest_moves` keeps those of newest attempts);
    ``delta``: counts added or removed directly (new rows; a new attempt replacing its key's newest);
    ``recount_all``: count from the rows instead (a bulk change; a job stored without counts). Counts that would
    go negative (rows changed by hand, not through a writer) are recounted too."""
    job = session.execute(select(Job).where(Job.id == job_id).execution_options(populate_existing=True)).scalar_one()
    if recount_all or job.counts is None:
        counts = Counter(recount(session, job_id))
    else:
        counts = Counter(job.counts)
        counts.update(newest_moves(session, moved))
        counts.update(dict(delta or {}))
    if any(v < 0 for v in counts.values()):  # rows changed behind the writers' backs (a hand-made UPDATE)
        counts = Counter(recount(session, job_id))
    stored = {k: v for k, v in sorted(counts.items()) if v}
    if stored != job.counts:
        job.counts = stored
        session.flush()
    if job.status == JobStatus.cancelled:
        return job.status
    summary = JobSummary(job.id, job.status, sum(stored.values()), stored, job_grades(job))
    if summary.total > 0 and summary.active == 0:
        new = JobStatus.done
    elif summary.counts.get(EpisodeStatus.running) or summary.active < summary.total:
        new = JobStatus.running
    else:  # everything still queued
        new = JobStatus.pending if job.status == JobStatus.pending else JobStatus.running
    if job.status != new:
        job.status = new.value
        session.flush()
    return job.status
