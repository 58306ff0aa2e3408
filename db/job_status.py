"""A job's status and counts, by the one result rule (``db.attempt_roles``).

``jobs.counts`` holds, per role, the number of attempts per status: ``{"result": {status: keys}, "resample":
{...}, "interactive": {...}, "steered": {...}}`` (``db.attempt_roles.roles_of``: each key's result attempt, and
the attempts kept apart from it; a broken run a retry replaced is counted nowhere). Every writer that changes an
episode's status or driver, or adds an attempt, holds the job's lock and calls :func:`refresh_job_status` in the
same transaction with what it changed; the counts of the keys it touched are recomputed by the rule from those
keys' attempts (a handful of rows), so the counts and ``jobs.status`` never lag behind the episodes, and no write
or read scans a job's episodes to know them (a finish at 12,800 episodes once recomputed the whole job).
:func:`recount` is the definition the counts must always equal (``tests/db/test_job_counts.py``). A job
without counts in this form (none yet, or {status: n} over the newest attempts, as versions before issue 44
stored them) is recounted by a read, and stored by its next writer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from db.attempt_roles import APART_ROLES, AttemptFacts, Role, RoleCounts, flat, key_counts, nested, with_roles
from db.models import ACTIVE_STATUSES, AGENT_EXIT_STATUSES, Episode, EpisodeStatus, Job, JobStatus


def job_grades(job: Job) -> bool:
    """Whether the job's agent exits (``submitted``, ``step_limit`` ...) still wait for a grade: its config's
    ``grade`` flag (``JobSpec.grade``), on unless the config says otherwise."""
    return bool((job.config or {}).get("grade", True))


@dataclass
class JobSummary:
    """A job's counts by the result rule: ``counts`` = status -> number of keys whose result attempt has it
    (``total`` keys); ``apart`` = role -> status -> attempts kept apart (resamples, interactive and steered
    attempts). ``active``: attempts of any role queued, running or (when the job grades) waiting for their grade;
    ``finished``: keys whose result is final."""

    job_id: str
    status: str
    total: int
    counts: dict[str, int] = field(default_factory=dict)  # status -> number of episode keys (result attempts)
    grades: bool = True
    apart: dict[str, dict[str, int]] = field(default_factory=dict)  # role -> status -> attempts

    def _waiting(self, counts: Mapping[str, int]) -> int:
        active = sum(counts.get(s, 0) for s in ACTIVE_STATUSES)
        return active + (sum(counts.get(s, 0) for s in AGENT_EXIT_STATUSES) if self.grades else 0)

    @property
    def awaiting_grade(self) -> int:
        return sum(self.counts.get(s, 0) for s in AGENT_EXIT_STATUSES) if self.grades else 0

    @property
    def active(self) -> int:
        """Attempts of any role still under way (queued, running, or waiting for a grade)."""
        return self._waiting(self.counts) + sum(self._waiting(by) for by in self.apart.values())

    @property
    def finished(self) -> int:
        """Keys whose result attempt is final."""
        return self.total - self._waiting(self.counts)

    @property
    def apart_total(self) -> dict[str, int]:
        """role -> attempts kept apart."""
        return {role: sum(by.values()) for role, by in self.apart.items() if sum(by.values())}

    @classmethod
    def of(cls, job: Job, counts: RoleCounts) -> JobSummary:
        result = {k: v for k, v in counts.get(Role.result.value, {}).items() if v}
        apart = {r.value: dict(counts[r.value]) for r in APART_ROLES if counts.get(r.value)}
        return cls(job.id, job.status, sum(result.values()), result, job_grades(job), apart)


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


def _valid(counts: Any) -> bool:
    """Stored counts in this version's form (an older version stored {status: n} over the newest attempts)."""
    return isinstance(counts, dict) and all(isinstance(v, dict) for v in counts.values())


def summarize(session: Session, job: Job) -> JobSummary:
    """The counts of ``job`` by the result rule."""
    return summarize_jobs(session, [job])[job.id]


def summarize_jobs(session: Session, jobs: Sequence[Job]) -> dict[str, JobSummary]:
    """:func:`summarize` for many jobs (the jobs list), by job id: their stored ``counts`` (a recount, not stored,
    for a job that has none in this version's form: a read never writes)."""
    missing = [j.id for j in jobs if not _valid(j.counts)]
    recounted = recount_jobs(session, missing) if missing else {}
    return {j.id: JobSummary.of(j, j.counts if _valid(j.counts) else recounted[j.id]) for j in jobs}


def recount(session: Session, job_id: str) -> RoleCounts:
    """The job's counts by the result rule, counted from the rows: what ``jobs.counts`` must always equal."""
    return recount_jobs(session, [job_id])[job_id]


def recount_jobs(session: Session, job_ids: Sequence[str]) -> dict[str, RoleCounts]:
    counts: dict[str, Counter[tuple[str, str]]] = defaultdict(Counter)
    if job_ids:
        query, role = with_roles(job_ids, Episode.job_id, Episode.status, func.count())
        for job_id, status, n, role_value in session.execute(query.group_by(Episode.job_id, Episode.status, role)):
            counts[job_id][(role_value, status)] += n
    return {j: nested(counts[j]) for j in job_ids}


#: (episode id, its status before, its status after) of a status change a writer made
Move = tuple[str, str, str]


def _touched_delta(
    session: Session,
    job_id: str,
    moved: Sequence[Move],
    driver_was: Mapping[str, str],
    added: Collection[str],
) -> Counter[tuple[str, str]]:
    """The change in counts that ``moved``, ``driver_was`` and ``added`` made: the rule applied to each touched
    key's attempts now, minus the rule applied to them as they were (moves undone, added attempts removed)."""
    added = set(added)
    ids = {i for i, old, new in moved if old != new} | set(driver_was) | added
    if not ids:
        return Counter()
    keys = {k for (k,) in session.execute(select(Episode.episode_key).where(Episode.id.in_(sorted(ids))))}
    rows = session.execute(
        select(Episode.id, Episode.episode_key, Episode.attempt, Episode.driver, Episode.status).where(
            Episode.job_id == job_id, Episode.episode_key.in_(sorted(keys))
        )
    ).all()
    was_status = {}
    for episode_id, old, _new in reversed(moved):  # the first move of an episode says where it started
        was_status[episode_id] = old
    now: dict[str, list[AttemptFacts]] = defaultdict(list)
    before: dict[str, list[AttemptFacts]] = defaultdict(list)
    for episode_id, key, attempt, driver, status in rows:
        now[key].append(AttemptFacts(attempt, driver, status))
        if episode_id not in added:
            old_driver = driver_was.get(episode_id, driver)
            before[key].append(AttemptFacts(attempt, old_driver, was_status.get(episode_id, status)))
    delta: Counter[tuple[str, str]] = Counter()
    for key in keys:
        delta.update(key_counts(now[key]))
        delta.subtract(key_counts(before[key]))
    return delta


def refresh_job_status(
    session: Session,
    job_id: str,
    *,
    moved: Sequence[Move] = (),
    driver_was: Mapping[str, str] | None = None,
    added: Collection[str] = (),
    new_keys: int = 0,
    recount_all: bool = False,
) -> str:
    """Bring ``jobs.counts`` up to date with what the caller just changed, in the caller's transaction under the
    job's lock, and store the job's status derived from them (a cancelled job stays cancelled): ``done`` once
    no attempt of any role is queued, running or (when the job grades) waiting for a grade. A ``failed`` job (an
    older version's mark for a failed send) is recomputed too: its episodes say where it is.

    ``moved``: the status changes of existing rows; ``driver_was``: {episode id: its driver before} of rows whose
    driver changed; ``added``: ids of new attempts of existing keys; ``new_keys``: how many new keys were added
    (attempt 1, queued: each a result); ``recount_all``: count from the rows instead (a bulk change). Counts that
    would go negative (rows changed by hand, not through a writer) are recounted too."""
    job = session.execute(select(Job).where(Job.id == job_id).execution_options(populate_existing=True)).scalar_one()
    if recount_all or not _valid(job.counts):
        counts = flat(recount(session, job_id))
    else:
        counts = flat(job.counts)
        counts.update(_touched_delta(session, job_id, moved, driver_was or {}, added))
        counts[(Role.result.value, EpisodeStatus.queued.value)] += new_keys
    if any(v < 0 for v in counts.values()):  # rows changed behind the writers' backs (a hand-made UPDATE)
        counts = flat(recount(session, job_id))
    stored = nested(counts)
    if stored != job.counts:
        job.counts = stored
        session.flush()
    if job.status == JobStatus.cancelled:
        return job.status
    summary = JobSummary.of(job, stored)
    under_way = any(n for by in (summary.counts, *summary.apart.values()) for s, n in by.items() if s == "running")
    if summary.total > 0 and summary.active == 0:
        new = JobStatus.done
    elif under_way or summary.finished > 0 or summary.apart:
        new = JobStatus.running
    else:  # everything still queued
        new = JobStatus.pending if job.status == JobStatus.pending else JobStatus.running
    if job.status != new:
        job.status = new.value
        session.flush()
    return job.status
