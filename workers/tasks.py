"""The Celery tasks: thin wrappers over :mod:`workers.execution`, plus enqueueing and cancelling a job.

- ``nexus.run_episode(episode_id)`` (queue ``gpu``): claim, run, store every turn, finish; then hand the
  patch to ``nexus.grade_episode`` (queue ``grade``). A duplicate or redelivered message finds the episode
  claimed or finished and returns without doing anything; a cancelled job's episodes do nothing either.
- ``nexus.grade_episode(episode_id)`` (queue ``grade``): grade the stored patch in a fresh container.
- ``nexus.resume_job(job_id)`` (queue ``default``): re-send every episode still queued or waiting for its
  grade (after a broker lost its data, say); duplicates are harmless, see above.

The task arguments are ids only: the episode's config lives in its database row, so a message can never
carry a stale copy. Each worker process opens the database once (lazily, after the fork).
"""

from __future__ import annotations

import logging
from typing import Any

from db import Database, connect
from db import store as db_store
from db.models import AGENT_EXIT_STATUSES
from workers.app import app
from workers.execution import execute_episode, grade_stored_episode

log = logging.getLogger(__name__)
_DB: dict[str, Database] = {}


def database() -> Database:
    """This process's connection to the results database (``$NEXUS_EVAL_DB``), migrated on first use."""
    url = app.conf.nexus_settings.db_url
    if url not in _DB:
        _DB[url] = connect(url)
    return _DB[url]


def _progress_reporter(task: Any):
    def report(meta: dict[str, Any]) -> None:
        try:
            task.update_state(state="PROGRESS", meta=meta)
        except Exception as exc:  # the PROGRESS store is a convenience: an outage must not fail the episode
            log.warning("could not publish progress: %s", exc)

    return report


class EpisodeTask(app.Task):
    """Records what the task body could not: the hard time limit killed the process (Celery calls
    ``on_failure`` in the worker's main process then), or the body itself raised."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):  # noqa: ANN001 - Celery's signature
        if not args:
            return
        status = "timeout" if type(exc).__name__ == "TimeLimitExceeded" else "infra_failure"
        try:
            with database().session() as s:
                db_store.fail_running_episode(s, args[0], status, f"{type(exc).__name__}: {exc} (task {task_id})")
        except Exception as db_exc:  # the row stays running; a later claim takes it over (dead worker)
            log.error("could not record %s for episode %s: %s", status, args[0], db_exc)


@app.task(name="nexus.run_episode", bind=True, base=EpisodeTask, acks_late=True, reject_on_worker_lost=True)
def run_episode_task(self: Any, episode_id: str) -> dict[str, Any]:
    settings = app.conf.nexus_settings
    db = database()
    # our own deadline before Celery's soft limit (10%, at most 5 min), so that a turn boundary usually ends
    # the run cleanly and the diff is taken; Celery's SoftTimeLimitExceeded (raised wherever the code is) is
    # the backstop and also ends as `timeout` with the turns stored so far
    soft = self.request.timelimit[1] if self.request.timelimit and self.request.timelimit[1] else None
    soft = soft or settings.soft_time_limit_s
    outcome = execute_episode(
        db,
        episode_id,
        celery_task_id=self.request.id,
        progress=_progress_reporter(self),
        soft_deadline_s=soft - min(0.1 * soft, 300.0),
        stale_after_s=settings.stale_after_s,
    )
    if outcome.needs_grade:
        grade_episode_task.apply_async((episode_id,), retry=True)
    return {
        "episode_id": episode_id,
        "ran": outcome.ran,
        "status": outcome.status,
        "reason": outcome.reason,
        "written": outcome.written,
    }


@app.task(name="nexus.grade_episode", bind=True, acks_late=True, reject_on_worker_lost=True)
def grade_episode_task(self: Any, episode_id: str) -> dict[str, Any]:
    return {"episode_id": episode_id, "status": grade_stored_episode(database(), episode_id)}


@app.task(name="nexus.resume_job", acks_late=True)
def resume_job_task(job_id: str) -> dict[str, int]:
    return enqueue_pending(database(), job_id)


@app.task(name="nexus.ping")
def ping() -> str:
    return "pong"


def enqueue_episode(db: Database, episode_id: str) -> str:
    """Send one episode to the ``gpu`` queue and remember the Celery task id on its row."""
    sent = run_episode_task.apply_async((episode_id,), retry=True)
    with db.session() as s:
        db_store.assign_celery_task(s, episode_id, sent.id)
    return sent.id


def enqueue_pending(db: Database, job_id: str) -> dict[str, int]:
    """Send every latest attempt of ``job_id`` that is queued (to ``gpu``) or awaiting a grade (to ``grade``)."""
    with db.session() as s:
        rows = [(r.id, r.status) for r in db_store.latest_attempts(s, [db_store.get_job(s, job_id).id])]
    counts = {"episodes": 0, "grades": 0}
    for episode_id, status in rows:
        if status == "queued":
            enqueue_episode(db, episode_id)
            counts["episodes"] += 1
        elif status in AGENT_EXIT_STATUSES:
            grade_episode_task.apply_async((episode_id,), retry=True)
            counts["grades"] += 1
    return counts


def cancel(db: Database, job_id: str, reason: str = "cancelled by user") -> list[str]:
    """Cancel a job: its queued/running episodes become ``cancelled`` in the database (what every worker
    checks), and their Celery messages are revoked. A running episode stops at its next turn."""
    with db.session() as s:
        task_ids = db_store.cancel_job(s, job_id, reason)
    if task_ids:
        try:
            app.control.revoke(task_ids)
        except Exception as exc:  # the database already says cancelled; revoking only saves a no-op delivery
            log.warning("revoke failed (episodes are cancelled in the database anyway): %s", exc)
    return task_ids
