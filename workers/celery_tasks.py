"""The Celery tasks: thin wrappers over :mod:`workers.execution`, plus enqueueing and cancelling a job.

- ``nexus.run_episode(episode_id)`` (queue ``gpu``): claim, run, store every turn, finish; then hand the
  patch to ``nexus.grade_episode`` (queue ``grade``). A duplicate or redelivered message finds the episode
  claimed or finished and returns without doing anything; a cancelled job's episodes do nothing either.
- ``nexus.grade_episode(episode_id)`` (queue ``grade``): grade the stored patch in a fresh container.
- ``nexus.resume_job(job_id)`` (queue ``default``): re-send every episode still queued or waiting for its
  grade (after a broker lost its data, say); duplicates are harmless, see above.

The task arguments are ids only: the episode's config lives in its database row, so a message can never
carry a stale copy. Each worker process opens the database once (lazily, after the fork) and loads each task
source once (``workers.task_cache``). Worker-host settings (episodes per GPU, the device) come from the app's
``ServiceSettings`` and are passed down as arguments.

The tasks are ``shared_task``s: they bind to whichever app the process built (``workers.app.get_app``), so
importing this module builds nothing. Senders publish by task name through an explicit app.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from db import Database, connect
from db import store as db_store
from db.models import AGENT_EXIT_STATUSES, EpisodeStatus
from workers.app import get_app
from workers.execution import EpisodeHooks, execute_episode, grade_stored_episode
from workers.task_cache import TaskCache

log = logging.getLogger(__name__)
RUN_EPISODE = "nexus.run_episode"
GRADE_EPISODE = "nexus.grade_episode"
RESUME_JOB = "nexus.resume_job"
_DB: dict[str, Database] = {}
_DB_LOCK = threading.Lock()  # a multi-episode (threads pool) worker asks from several threads at once
_TASKS = TaskCache()  # this process's task sources, each loaded once (episodes and grades alike)


def database(app: Celery) -> Database:
    """This process's connection to ``app``'s results database, migrated on first use."""
    url = app.conf.nexus_settings.db_url
    with _DB_LOCK:
        if url not in _DB:
            _DB[url] = connect(url)
        return _DB[url]


def _progress_reporter(task: Task):
    def report(meta: dict[str, Any]) -> None:
        try:
            task.update_state(state="PROGRESS", meta=meta)
        except Exception as exc:  # the PROGRESS store is a convenience: an outage must not fail the episode
            log.warning("could not publish progress: %s", exc)

    return report


class EpisodeTask(Task):
    """Records what the task body could not: the hard time limit killed the process (Celery calls
    ``on_failure`` in the worker's main process then), or the body itself raised."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):  # noqa: ANN001 - Celery's signature
        if not args:
            return
        status = EpisodeStatus.timeout if isinstance(exc, TimeLimitExceeded) else EpisodeStatus.infra_failure
        try:
            with database(self.app).session() as s:
                db_store.fail_running_episode(s, args[0], status, f"{type(exc).__name__}: {exc} (task {task_id})")
        except Exception as db_exc:  # the row stays running; a later claim takes it over (dead worker)
            log.error("could not record %s for episode %s: %s", status, args[0], db_exc)


@shared_task(name=RUN_EPISODE, bind=True, base=EpisodeTask, acks_late=True, reject_on_worker_lost=True)
def episode_task(self: Task, episode_id: str) -> dict[str, Any]:
    settings = self.app.conf.nexus_settings
    # our own deadline before Celery's soft limit (10%, at most 5 min), so that a turn boundary usually ends
    # the run cleanly and the diff is taken; Celery's SoftTimeLimitExceeded (raised wherever the code is) is
    # the backstop and also ends as `timeout` with the turns stored so far
    soft = self.request.timelimit[1] if self.request.timelimit and self.request.timelimit[1] else None
    soft = soft or settings.soft_time_limit_s
    outcome = execute_episode(
        database(self.app),
        episode_id,
        tasks=_TASKS,
        celery_task_id=self.request.id,
        soft_deadline_s=soft - min(0.1 * soft, 300.0),
        stale_after_s=settings.stale_after_s,
        episodes_per_gpu=settings.episodes_per_gpu,
        device=settings.device,
        hooks=EpisodeHooks(progress=_progress_reporter(self), time_limits=(SoftTimeLimitExceeded,)),
    )
    if outcome.needs_grade:
        self.app.send_task(GRADE_EPISODE, (episode_id,), retry=True)
    return {
        "episode_id": episode_id,
        "ran": outcome.ran,
        "status": outcome.status,
        "reason": outcome.reason,
        "written": outcome.written,
    }


@shared_task(name=GRADE_EPISODE, bind=True, acks_late=True, reject_on_worker_lost=True)
def grade_task(self: Task, episode_id: str) -> dict[str, Any]:
    return {"episode_id": episode_id, "status": grade_stored_episode(database(self.app), episode_id, tasks=_TASKS)}


@shared_task(name=RESUME_JOB, bind=True, acks_late=True)
def resume_job_task(self: Task, job_id: str) -> dict[str, int]:
    return enqueue_pending(database(self.app), job_id, app=self.app)


@shared_task(name="nexus.ping")
def ping() -> str:
    return "pong"


def enqueue_episode(db: Database, episode_id: str, *, app: Celery | None = None) -> str:
    """Send one episode to the ``gpu`` queue and remember the Celery task id on its row.
    ``app``: the process's app by default (``workers.app.get_app``)."""
    sent = (app or get_app()).send_task(RUN_EPISODE, (episode_id,), retry=True)
    with db.session() as s:
        db_store.assign_celery_task(s, episode_id, sent.id)
    return sent.id


def enqueue_pending(db: Database, job_id: str, *, app: Celery | None = None) -> dict[str, int]:
    """Send every latest attempt of ``job_id`` that is queued (to ``gpu``) or awaiting a grade (to ``grade``)."""
    app = app or get_app()
    with db.session() as s:
        rows = [(r.id, r.status) for r in db_store.latest_attempts(s, [db_store.get_job(s, job_id).id])]
    counts = {"episodes": 0, "grades": 0}
    for episode_id, status in rows:
        if status == EpisodeStatus.queued:
            enqueue_episode(db, episode_id, app=app)
            counts["episodes"] += 1
        elif status in AGENT_EXIT_STATUSES:
            app.send_task(GRADE_EPISODE, (episode_id,), retry=True)
            counts["grades"] += 1
    return counts


class NotEnqueued(RuntimeError):
    """Rerun attempts were stored (``queued``) but not all sent to the broker; ``episode_ids`` are the stored
    ones. Nothing is lost: ``nexus.resume_job`` (``enqueue_pending``) sends a job's queued episodes later."""

    def __init__(self, episode_ids: list[str], cause: Exception) -> None:
        super().__init__(
            f"{len(episode_ids)} new attempt(s) are stored (queued) but could not all be sent to the queue: "
            f"{type(cause).__name__}: {cause}; the Celery task nexus.resume_job sends a job's queued episodes "
            "once the broker is reachable"
        )
        self.episode_ids = episode_ids


def rerun(db: Database, job_id: str, statuses: list[str], *, app: Celery | None = None) -> list[str]:
    """New attempt rows for the job's newest episodes in ``statuses`` (the old rows stay), sent to the ``gpu``
    queue; returns their ids. ``LookupError``/``ValueError`` for a bad job or status; :class:`NotEnqueued` when
    the rows are stored but the broker could not take them all."""
    with db.session() as s:
        new_ids = [r.id for r in db_store.rerun_job(s, db_store.get_job(s, job_id).id, statuses)]
    try:
        for episode_id in new_ids:
            enqueue_episode(db, episode_id, app=app)
    except Exception as exc:  # the broker: the rows are already stored as queued
        raise NotEnqueued(new_ids, exc) from exc
    return new_ids


def cancel(db: Database, job_id: str, reason: str = "cancelled by user", *, app: Celery | None = None) -> list[str]:
    """Cancel a job: its queued/running episodes become ``cancelled`` in the database (what every worker
    checks), and their Celery messages are revoked. A running episode stops at its next turn."""
    with db.session() as s:
        task_ids = db_store.cancel_job(s, job_id, reason)
    if task_ids:
        try:
            (app or get_app()).control.revoke(task_ids)
        except Exception as exc:  # the database already says cancelled; revoking only saves a no-op delivery
            log.warning("revoke failed (episodes are cancelled in the database anyway): %s", exc)
    return task_ids
