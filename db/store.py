"""Episodes and their attempts: run one (the claim contract of :mod:`db.claims` and :mod:`db.finishing`,
re-exported here), read what a job ran or measured, and rerun. Creating, finding, cancelling and summarizing a job
is :mod:`db.job_rows`.

Running one episode (see :mod:`db.claims` for the idempotency contract)::

    with db.session() as s: claim = claim_episode(s, episode_id, celery_task_id=task_id)
    if claim is None: return                                       # someone else has it / it is done
    with db.session() as s: record_turn(s, claim, 0, tokens_generated=..., completion=...)
    with db.session() as s: finish_episode(s, claim, "submitted", patch=diff, agent_s=...)
    with db.session() as s: record_grade(s, episode_id, "resolved", test_log=log, grader="swebench", ...)

Reading loads each row without its payloads (:data:`PAYLOAD_COLUMNS`: patch, test log, result, retention map;
``full=True`` loads them, for one episode or a stream), so a job-level read stays small at any size; touching an
unloaded payload raises instead of quietly loading it row by row.
Reading: :func:`episodes_for_job`, :func:`result_attempts` (what a job measured: ``compare``, ``export``),
:func:`resample_attempts` (the agent attempts after a key's result: kept apart), :func:`latest_attempts` (what is
running), :func:`interactive_attempts`.
Reruns: :func:`new_attempt` / :func:`rerun_job` add rows with ``attempt + 1``; old rows are never changed.
An attempt's ``driver`` (``db.models.AttemptDriver``) says whether the agent alone chose its actions.

Which attempt is a key's result (one sample per key, so Pass@1 is never a best-of-n) is decided in one place,
``db.attempt_roles``: the *first* agent attempt that did not end as a broken run (``SERVICE_FAILURE_STATUSES``:
timeout, infra_failure, cancelled). A rerun of a broken run replaces it; a rerun of a verdict or an agent exit is a
*resample*, counted nowhere in Pass@1 (``docs/numbers.md``). A key whose every attempt broke has its newest one as
its result. Every count (``jobs.counts``, the progress tables and lines, the dashboard) reads the same rule.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session, load_only
from sqlalchemy.sql import Select

from db.attempt_roles import result_attempt_numbers
from db.claims import (
    Claim,
    ClaimLost,
    claim_episode,
    expire_loaded,
    heartbeat,
    local_worker_is_dead,
    lock_job,
    record_turn,
    worker_identity,
)
from db.connection import begin_write
from db.finishing import fail_running_episode, finish_episode, record_grade
from db.job_rows import by_id_or_prefix
from db.job_status import newest_attempts, refresh_job_status
from db.models import (
    ACTIVE_STATUSES,
    AGENT_DRIVERS,
    SERVICE_FAILURE_STATUSES,
    AttemptDriver,
    Episode,
    EpisodeStatus,
    Job,
    JobStatus,
    utcnow,
)

__all__ = [
    "Claim",
    "ClaimLost",
    "assign_celery_task",
    "at_numbers",
    "claim_episode",
    "episodes_for_job",
    "fail_running_episode",
    "finish_episode",
    "get_episode",
    "heartbeat",
    "interactive_attempts",
    "latest_attempts",
    "local_worker_is_dead",
    "lock_job",
    "new_attempt",
    "record_grade",
    "record_turn",
    "rerun_job",
    "resample_attempts",
    "result_attempt_numbers",
    "result_attempts",
    "result_rows",
    "stale_episodes",
    "worker_identity",
]


#: the large columns of an episode (a grade log, a retention map of ~10^4 runs, the runner's record): loaded only
#: when asked for (``full=True``), never by a job-level read
PAYLOAD_COLUMNS = frozenset({"patch", "test_log", "result", "retention"})


def _loading(query: Select, full: bool) -> Select:
    """``query`` (over ``Episode``) re-reading rows the claim/grade functions changed with Core UPDATEs (which do
    not refresh objects already in the session), with or without the payloads."""
    query = query.execution_options(populate_existing=True)
    if full:
        return query
    brief = [getattr(Episode, c.key) for c in Episode.__table__.columns if c.key not in PAYLOAD_COLUMNS]
    extracted = (Episode.needs_network, Episode.config_density, Episode.config_backend, Episode.config_agent_seed)
    return query.options(load_only(*brief, *extracted, Episode.config_seed, raiseload=True))


def get_episode(session: Session, episode_id: str) -> Episode:
    """The episode with this id or unique id prefix; ``LookupError`` otherwise."""
    return by_id_or_prefix(session, Episode, episode_id)


def assign_celery_task(session: Session, episode_id: str, celery_task_id: str) -> bool:
    """Remember the Celery task id an episode was enqueued under (only while it is still queued)."""
    begin_write(session)
    done = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, Episode.status == "queued")
        .values(celery_task_id=celery_task_id)
        .execution_options(synchronize_session=False)
    )
    expire_loaded(session, {episode_id})
    return done.rowcount == 1


def episodes_for_job(
    session: Session,
    job_id: str,
    *,
    statuses: Collection[str] | None = None,
    latest_only: bool = False,
    full: bool = False,
) -> list[Episode]:
    """The job's episodes ordered by key then attempt; optionally only the newest attempt per key and/or
    only those in ``statuses``."""
    rows = (
        latest_attempts(session, [job_id], full=full)
        if latest_only
        else list(session.execute(_loading(select(Episode).where(Episode.job_id == job_id), full)).scalars())
    )
    if statuses is not None:
        rows = [r for r in rows if r.status in statuses]
    return sorted(rows, key=lambda r: (r.episode_key, r.attempt))


def latest_attempts(
    session: Session, job_ids: Sequence[str], *, drivers: Collection[str] | None = None, full: bool = False
) -> list[Episode]:
    """The newest attempt of every episode key of the given jobs, ordered by job then key; with ``drivers``,
    the newest among the attempts those drivers drove (``db.models.AttemptDriver``). What is running and
    what a job waits for: every driver. What a job measured: :func:`result_attempts`."""
    newest, is_newest = newest_attempts(job_ids, drivers=drivers)
    query = _loading(select(Episode).join(newest, is_newest), full)
    return sorted(session.execute(query).scalars(), key=lambda r: (r.job_id, r.episode_key))


def result_attempts(
    session: Session, job_ids: Sequence[str], *, include_interactive: bool = False, full: bool = False
) -> list[Episode]:
    """The attempt that is each episode key's result: the first one the agent drove alone that did not end as a
    broken run (module docstring). A key whose only attempts were run interactively has none.
    ``include_interactive``: a key's newest interactive attempt that did not break stands in for the agent's
    result (every reader marks it: a person chose to run it, so it is not the method's sample)."""
    numbers = result_attempt_numbers(job_ids, include_interactive=include_interactive)
    return sorted(_rows_at(session, numbers, full), key=lambda r: (r.job_id, r.episode_key))


#: the columns a job-level summary reads of each result attempt (``results.compare``): no payload, no turn
SUMMARY_COLUMNS = (
    *("id", "job_id", "task_id", "method", "scope", "protocol", "seed", "attempt", "driver", "episode_key"),
    *("status", "exit_status", "grader", "grader_version", "needs_network", "n_turns", "generated_tokens"),
    *("wall_s", "kv_peak_held_bytes", "kv_peak_allocated_bytes", "mean_kv_held_bytes", "kept_fraction"),
    *("config_density", "config_backend", "config_agent_seed", "config_seed"),
)


def result_rows(session: Session, job_ids: Sequence[str], *, include_interactive: bool = False) -> list[Any]:
    """:func:`result_attempts` as plain rows of :data:`SUMMARY_COLUMNS` (read by attribute, like the ORM rows):
    a job of 12,800 episodes is read in a fraction of the time it takes to build an ORM object per row."""
    numbers = result_attempt_numbers(job_ids, include_interactive=include_interactive)
    query = select(*(getattr(Episode, name) for name in SUMMARY_COLUMNS)).join(numbers, at_numbers(numbers))
    return sorted(session.execute(query), key=lambda r: (r.job_id, r.episode_key))


def resample_attempts(session: Session, job_ids: Sequence[str]) -> list[Episode]:
    """The agent attempts of each key that came after its result attempt and did not end as a broken run: new
    samples of a key that already had one (``rerun --status unresolved``, say), kept apart from Pass@1. Ordered by
    job, key, attempt."""
    result = result_attempt_numbers(job_ids)
    query = (
        _loading(select(Episode), False)
        .join(
            result,
            and_(
                Episode.job_id == result.c.job_id,
                Episode.episode_key == result.c.episode_key,
                Episode.attempt > result.c.attempt,
            ),
        )
        .where(Episode.driver.in_(sorted(AGENT_DRIVERS)), Episode.status.not_in(sorted(SERVICE_FAILURE_STATUSES)))
    )
    return sorted(session.execute(query).scalars(), key=lambda r: (r.job_id, r.episode_key, r.attempt))


def at_numbers(numbers: Any) -> Any:
    """The join condition that keeps the ``Episode`` row each (job_id, episode_key, attempt) of ``numbers`` names."""
    return and_(
        Episode.job_id == numbers.c.job_id,
        Episode.episode_key == numbers.c.episode_key,
        Episode.attempt == numbers.c.attempt,
    )


def _rows_at(session: Session, numbers: Any, full: bool) -> list[Episode]:
    """The Episode rows named by a (job_id, episode_key, attempt) subquery."""
    return list(session.execute(_loading(select(Episode), full).join(numbers, at_numbers(numbers))).scalars())


def interactive_attempts(session: Session, job_ids: Sequence[str]) -> list[Episode]:
    """Every attempt of the given jobs run with ``rerun --interactive`` (steered or not), by job, key, attempt."""
    query = _loading(select(Episode), False).where(
        Episode.job_id.in_(list(job_ids)), Episode.driver.not_in(sorted(AGENT_DRIVERS))
    )
    return sorted(session.execute(query).scalars(), key=lambda r: (r.job_id, r.episode_key, r.attempt))


def new_attempt(
    session: Session,
    episode_id: str,
    *,
    config_overrides: dict[str, Any] | None = None,
    driver: str = AttemptDriver.agent.value,
) -> Episode:
    """A new ``queued`` row for the same key with attempt = newest attempt + 1. The source must have
    finished (not queued/running). ``config_overrides`` are merged over the source's config. ``driver``:
    ``interactive`` for ``rerun --interactive`` (it becomes ``steered`` when the operator changes an action)."""
    if driver not in {d.value for d in AttemptDriver}:
        raise ValueError(f"unknown driver {driver!r}; known: {[d.value for d in AttemptDriver]}")
    begin_write(session)
    source = get_episode(session, episode_id)
    lock_job(session, source.job_id)  # job lock first, like every writer (see db.claims.lock_job)
    session.refresh(source)
    if source.status in ACTIVE_STATUSES:
        raise ValueError(f"episode {source.id} is {source.status}; only a finished episode can be rerun")
    newest = session.execute(
        select(Episode.attempt)
        .where(Episode.job_id == source.job_id, Episode.episode_key == source.episode_key)
        .order_by(Episode.attempt.desc())
        .limit(1)
    ).scalar_one()
    row = Episode(
        job_id=source.job_id,
        task_id=source.task_id,
        method=source.method,
        scope=source.scope,
        protocol=source.protocol,
        seed=source.seed,
        attempt=newest + 1,
        episode_key=source.episode_key,
        status=EpisodeStatus.queued.value,
        driver=driver,
        config={**(source.config or {}), **(config_overrides or {})},
    )
    session.add(row)
    session.flush()
    job = session.get(Job, source.job_id)
    if job is not None and job.status in (JobStatus.done, JobStatus.failed, JobStatus.cancelled):
        job.status = JobStatus.running.value  # reopened: refresh_job_status closes it again when done
        job.error = None
    refresh_job_status(session, source.job_id, added=[row.id])
    return row


def rerun_job(session: Session, job_id: str, statuses: Collection[str]) -> list[Episode]:
    """New attempts for every result attempt of ``job_id`` whose status is in ``statuses``. A new attempt of a
    broken run (timeout, infra_failure, cancelled) becomes the key's result; one of a verdict or an agent exit is a
    resample, kept apart (:func:`resample_attempts`)."""
    unknown = sorted(set(statuses) - {s.value for s in EpisodeStatus})
    if unknown:
        raise ValueError(f"unknown episode status(es) {unknown}; known: {[s.value for s in EpisodeStatus]}")
    if set(statuses) & ACTIVE_STATUSES:
        raise ValueError("queued/running episodes cannot be rerun; cancel them first")
    targets = [r for r in result_attempts(session, [job_id]) if r.status in statuses]
    return [new_attempt(session, r.id) for r in targets]


def stale_episodes(session: Session, stale_after_s: float, *, job_id: str | None = None) -> list[Episode]:
    """Running episodes whose heartbeat is older than ``stale_after_s`` (their worker is probably gone;
    a redelivery or ``claim_episode(..., stale_after_s=...)`` takes them over)."""
    query = select(Episode).where(Episode.status == "running").execution_options(populate_existing=True)
    if job_id is not None:
        query = query.where(Episode.job_id == job_id)
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    return [r for r in session.execute(query).scalars() if r.heartbeat_at is None or r.heartbeat_at < cutoff]
