"""Submitting a job: validate the spec and its task selection, store the job and its episodes, enqueue.

Everything that can be wrong with a job (a bad field, an unknown task id, a missing suite) is found before
the first row is written, so a rejected job leaves nothing behind: no job row, no message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from db import Database
from db import store as db_store
from workers.spec import JobSpec, JobSpecError

if TYPE_CHECKING:
    from celery import Celery

    from env.grading.limits import GradingCeilings
    from env.tasks import Task


def load_tasks(spec: JobSpec, ceilings: GradingCeilings | None = None) -> list[Task]:
    """The job's tasks; ``JobSpecError`` for a bad selection (an unknown id, a missing suite) or a row over the
    operator's grading ``ceilings`` (``ServiceSettings.grading_ceilings``; None: the defaults)."""
    try:
        return spec.tasks.load(ceilings)
    except JobSpecError:
        raise
    except (ValueError, OSError, LookupError) as exc:
        raise JobSpecError("<task selection>", [("tasks", f"cannot load {spec.tasks.source!r}: {exc}")]) from None


def plan_episodes(spec: JobSpec, tasks: list[Task]) -> list:
    """The fanned-out episodes (``workers.spec.EpisodeKey``) over the job's loaded ``tasks``
    (:func:`load_tasks`); raises ``JobSpecError`` for a bad selection."""
    return spec.episodes([t.instance_id for t in tasks])


def create_job_rows(db: Database, spec: JobSpec, tasks: list[Task]) -> tuple[str, list[str]]:
    """Store the job and its attempt-1 episodes (status ``queued``) over its loaded ``tasks``; returns
    (job id, episode ids)."""
    keys = plan_episodes(spec, tasks)
    with db.session() as s:
        job = db_store.create_job(
            s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash(), name=spec.name
        )
        rows = db_store.add_episodes(s, job.id, keys)
        return job.id, [r.id for r in rows]


def submit(db: Database, spec: JobSpec, tasks: list[Task], *, app: Celery | None = None) -> tuple[str, int]:
    """Store the job and send its episodes to the ``gpu`` queue through ``app`` (default: the process's app,
    ``workers.app.get_app``); returns (job id, number enqueued). ``tasks``: the job's tasks as
    :func:`load_tasks` loaded them, once per submission (the caller has them already for its checks).

    If the broker cannot take them, the rows stay ``queued`` (the job is not failed: its episodes say where it
    is) and ``workers.celery_tasks.NotEnqueued`` is raised, naming the job and ``nexus-eval resume JOB``."""
    from workers.celery_tasks import enqueue_pending, note_unsent

    job_id, episode_ids = create_job_rows(db, spec, tasks)
    try:
        counts = enqueue_pending(db, job_id, app=app)
    except Exception as exc:
        raise note_unsent(db, job_id, episode_ids, exc) from exc
    return job_id, counts["episodes"]
