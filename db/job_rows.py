"""Jobs as rows: create one, fan out its episodes, find, list and summarize jobs, cancel one, note an error on it.

A submission is two writes in one session::

    with db.session() as s:
        job = create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash(), name=spec.name)
        add_episodes(s, job.id, spec.episodes(available_task_ids))   # objects with task_id/method/...

What happens to each episode after that (claimed, run, graded, rerun) and which attempt is a key's result is
:mod:`db.store`'s (over :mod:`db.claims` and :mod:`db.attempt_roles`); a job's status and counts are derived from
its episodes (:mod:`db.job_status`), never set here except by a cancel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.claims import expire_loaded, lock_job
from db.connection import begin_write
from db.job_status import JobSummary, refresh_job_status, summarize
from db.models import ACTIVE_STATUSES, CANCELLABLE_STATUSES, Episode, EpisodeStatus, Job, JobStatus
from db.provenance import git_revision as current_git_revision
from db.provenance import package_versions as current_package_versions

__all__ = [
    "EpisodeKeyLike",
    "add_episodes",
    "by_id_or_prefix",
    "cancel_job",
    "create_job",
    "episode_key",
    "get_job",
    "job_summary",
    "list_jobs",
    "note_job_error",
]


class EpisodeKeyLike(Protocol):
    """What :func:`add_episodes` needs from each fanned-out episode (``jobs.spec.EpisodeKey`` fits)."""

    task_id: str
    method: str
    scope: str
    protocol: str
    seed: int


def episode_key(task_id: str, method: str, scope: str, protocol: str, seed: int) -> str:
    """The stable key of an episode without its attempt: ``task|method|scope|protocol|seed``."""
    return f"{task_id}|{method}|{scope}|{protocol}|{seed}"


def create_job(
    session: Session,
    *,
    config: dict[str, Any],
    config_hash: str,
    name: str | None = None,
    package_versions: dict[str, str] | None = None,
    git_revision: str | None = None,
) -> Job:
    """Insert a ``pending`` job. ``config`` is the frozen JobSpec as JSON; provenance defaults to this
    process's package versions and the service checkout's git revision."""
    begin_write(session)
    job = Job(
        name=name,
        config=config,
        config_hash=config_hash,
        package_versions=current_package_versions() if package_versions is None else package_versions,
        git_revision=current_git_revision() if git_revision is None else git_revision,
        status=JobStatus.pending.value,
        counts={},
    )
    session.add(job)
    session.flush()
    return job


def add_episodes(
    session: Session, job_id: str, episodes: Iterable[EpisodeKeyLike], *, config: dict[str, Any] | None = None
) -> list[Episode]:
    """Add attempt-1 ``queued`` rows for each key. ``config`` (the merged per-episode config) is stored on
    every row; an item with its own ``config`` attribute (a dict) is merged over it."""
    begin_write(session)
    rows = []
    for item in episodes:
        own = getattr(item, "config", None) or {}
        rows.append(
            Episode(
                job_id=job_id,
                task_id=item.task_id,
                method=item.method,
                scope=item.scope,
                protocol=item.protocol,
                seed=item.seed,
                attempt=1,
                episode_key=episode_key(item.task_id, item.method, item.scope, item.protocol, item.seed),
                status=EpisodeStatus.queued.value,
                config={**(config or {}), **own},
            )
        )
    session.add_all(rows)
    session.flush()
    refresh_job_status(session, job_id, new_keys=len(rows))
    return rows


def by_id_or_prefix(session: Session, model: type[Any], ident: str) -> Any:
    """The row of ``model`` (a table with a string ``id``) with this id or unique id prefix; ``LookupError``
    naming the kind of row ("job", "probe run") otherwise."""
    row = session.get(model, ident)
    if row is not None:
        return row
    matches = session.execute(select(model).where(model.id.startswith(ident, autoescape=True)).limit(2)).scalars().all()
    kind = model.__tablename__[:-1].replace("_", " ")
    if not matches:
        raise LookupError(f"no {kind} with id {ident!r}")
    if len(matches) > 1:
        raise LookupError(f"{kind} id prefix {ident!r} is ambiguous ({matches[0].id}, {matches[1].id}, ...)")
    return matches[0]


def get_job(session: Session, job_id: str) -> Job:
    """The job with this id or unique id prefix; ``LookupError`` (saying which) otherwise."""
    return by_id_or_prefix(session, Job, job_id)


def list_jobs(session: Session, *, limit: int = 20) -> list[Job]:
    """The newest ``limit`` jobs, newest first."""
    return list(session.execute(select(Job).order_by(Job.created_at.desc()).limit(limit)).scalars())


def job_summary(session: Session, job_id: str) -> JobSummary:
    """The job (id or unique prefix) and its counts by the result rule (``db.attempt_roles``)."""
    return summarize(session, get_job(session, job_id))


def cancel_job(session: Session, job_id: str, reason: str = "cancelled by user") -> list[str] | None:
    """Cancel the job and every queued/running episode of it (a grade still to come is then never taken). Returns
    the Celery task ids to revoke, or ``None`` when the job has no episode queued, running or waiting for its
    grade: then nothing changes (a finished job keeps its status).

    A worker still running one of them finds out at its next ``record_turn`` (``ClaimLost``); its
    ``finish_episode`` returns ``False``."""
    begin_write(session)
    job = lock_job(session, get_job(session, job_id).id)
    in_job = Episode.job_id == job.id
    cancellable = select(Episode.id).where(in_job, Episode.status.in_(sorted(CANCELLABLE_STATUSES))).limit(1)
    if session.execute(cancellable).first() is None:
        return None
    active = session.execute(
        select(Episode.id, Episode.celery_task_id).where(in_job, Episode.status.in_(sorted(ACTIVE_STATUSES)))
    ).all()
    task_ids = sorted({r.celery_task_id for r in active if r.celery_task_id})
    session.execute(
        update(Episode)
        .where(Episode.job_id == job.id, Episode.status.in_(list(ACTIVE_STATUSES)))
        .values(status=EpisodeStatus.cancelled.value, error=reason)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {r.id for r in active})
    job.status = JobStatus.cancelled.value
    job.error = reason
    session.flush()
    refresh_job_status(session, job.id, recount_all=True)  # a bulk change: counted from the rows once
    return task_ids


def note_job_error(session: Session, job_id: str, error: str) -> None:
    """Set the job's ``error`` note (e.g. its episodes could not all be sent); its status stays derived from
    its episodes."""
    begin_write(session)
    job = lock_job(session, get_job(session, job_id).id)
    job.error = error
    session.flush()
