"""Submitting a job: validate the spec and its task selection, plan its episodes, store the job and them, enqueue.

Everything that can be wrong with a job (a bad field, an unknown task id, a missing suite) is found before
the first row is written, so a rejected job leaves nothing behind: no job row, no message. The fan-out is
computed once per submission (:func:`plan_job`, through :func:`plan_episodes`); storing and enqueueing take
that :class:`PlannedJob` and never compute it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_runner.dense_reuse import dense_rendering
from db import Database, job_rows
from jobs.job_file import JobSpecError
from jobs.spec import EpisodeKey, JobSpec
from nexus.methods import DENSE

if TYPE_CHECKING:
    from celery import Celery

    from env.tasks.ceilings import GradingCeilings
    from env.tasks.loading import Task


def load_job_tasks(spec: JobSpec, ceilings: GradingCeilings | None = None) -> list[Task]:
    """The job's tasks (its selection read through ``env.tasks.load_tasks``, which loads a source and knows no
    job); ``JobSpecError`` for a bad selection (an unknown id, a missing suite) or a row over the
    operator's grading ``ceilings`` (``ServiceSettings.grading_ceilings``; None: the defaults)."""
    try:
        return spec.tasks.load(ceilings)
    except JobSpecError:
        raise
    except (ValueError, OSError, LookupError) as exc:
        raise JobSpecError(spec.tasks.named, [("tasks", f"cannot load {spec.tasks.source!r}: {exc}")]) from None


def plan_spec(spec: JobSpec) -> JobSpec:
    """``spec`` with its planning answer in ``dense_rendering``: where dense runs beside several protocols (and not in
    every cell), whether one dense episode may stand for all of them (``agent_runner.dense_reuse.dense_rendering``:
    the model's chat template checked on a rendered two-turn conversation with a reasoning block); else None."""
    needed = DENSE in spec.methods and len(spec.protocols) > 1 and not spec.dense_per_cell
    answer = dense_rendering(spec.backend, spec.model) if needed else None
    return spec if answer == spec.dense_rendering else spec.model_copy(update={"dense_rendering": answer})


def plan_episodes(spec: JobSpec, tasks: list[Task]) -> list[EpisodeKey]:
    """The fanned-out episodes (``jobs.spec.EpisodeKey``) over the job's loaded ``tasks``
    (:func:`load_job_tasks`) and its planned spec (:func:`plan_spec`: dense under each protocol unless one episode
    stands for all); raises ``JobSpecError`` for a bad selection. The one place the fan-out is computed."""
    return plan_spec(spec).episodes([t.instance_id for t in tasks])


@dataclass(frozen=True)
class PlannedJob:
    """A job ready to be stored: its spec, its tasks as :func:`load_job_tasks` loaded them, and the episodes they fan
    out to (:func:`plan_episodes`), in fan-out order. Made once per submission by :func:`plan_job`."""

    spec: JobSpec
    tasks: tuple[Task, ...]
    keys: tuple[EpisodeKey, ...]


def plan_job(spec: JobSpec, tasks: list[Task], *, source: str = "<spec>") -> PlannedJob:
    """``spec`` over its loaded ``tasks``, planned (``JobSpecError`` naming ``source`` for a method its backend cannot
    run, ``JobSpec.check_backend_methods``, or a bad selection, before anything is stored); the planned spec
    (:func:`plan_spec`) is what is stored."""
    spec.check_backend_methods(source=source)
    spec = plan_spec(spec)
    return PlannedJob(spec=spec, tasks=tuple(tasks), keys=tuple(plan_episodes(spec, tasks)))


def create_job_rows(db: Database, plan: PlannedJob) -> tuple[str, list[str]]:
    """Store the job and its attempt-1 episodes (status ``queued``), one per planned key; returns
    (job id, episode ids)."""
    spec = plan.spec
    with db.session() as s:
        job = job_rows.create_job(
            s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash(), name=spec.name
        )
        rows = job_rows.add_episodes(s, job.id, plan.keys)
        return job.id, [r.id for r in rows]


def submit(db: Database, plan: PlannedJob, *, app: Celery | None = None) -> tuple[str, int]:
    """Store the planned job (:func:`plan_job`, once per submission: the caller has it already for its checks) and
    send its episodes to the ``gpu`` queue through ``app`` (default: the process's app, ``jobs.queue.get_app``);
    returns (job id, number enqueued).

    If the broker cannot take them, the rows stay ``queued`` (the job is not failed: its episodes say where it
    is) and ``jobs.control.NotEnqueued`` is raised, naming the job and ``nexus-eval resume JOB``."""
    from jobs.control import enqueue_pending, note_unsent

    job_id, episode_ids = create_job_rows(db, plan)
    try:
        counts = enqueue_pending(db, job_id, app=app)
    except Exception as exc:
        raise note_unsent(db, job_id, episode_ids, exc) from exc
    return job_id, counts["episodes"]
