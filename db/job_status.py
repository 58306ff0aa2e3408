"""A job's status, derived from the newest attempt of each of its episodes.

Every writer that changes an episode's status (claims, finishes, grades, reruns) calls
:func:`refresh_job_status` in the same transaction, so ``jobs.status`` never lags behind its episodes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

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
    """:func:`summarize` for many jobs in one query (the jobs list), by job id."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    if jobs:
        newest, is_newest = newest_attempts([j.id for j in jobs])
        query = select(Episode.job_id, Episode.status, func.count()).join(newest, is_newest)
        for job_id, status, n in session.execute(query.group_by(Episode.job_id, Episode.status)):
            counts[job_id][status] += n
    return {
        j.id: JobSummary(j.id, j.status, sum(counts[j.id].values()), dict(counts[j.id]), job_grades(j)) for j in jobs
    }


def refresh_job_status(session: Session, job_id: str) -> str:
    """Recompute and store the job's status from its episodes (a cancelled job stays cancelled): ``done``
    once nothing is queued, running or (when the job grades) waiting for a grade. A ``failed`` job (an older
    version's mark for a failed send) is recomputed too: its episodes say where it is."""
    job = session.execute(select(Job).where(Job.id == job_id).execution_options(populate_existing=True)).scalar_one()
    if job.status == JobStatus.cancelled:
        return job.status
    summary = summarize(session, job)
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
