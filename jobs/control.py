"""Sending a job's episodes and steering a job from outside a worker: enqueue, rerun, cancel.

The sender's half of the queue (``submit``, ``rerun``, ``cancel``, the dashboard's buttons): it publishes by task
name through :func:`jobs.queue.get_app` and never imports the worker's tasks, so a web process registers no Celery
signal handlers. ``resume`` (sending again what a gone worker held) is the workers' fault recovery
(``workers.celery_tasks.resume``).
"""

from __future__ import annotations

import logging

from celery import Celery

from db import Database, job_rows
from db import store as db_store
from db.liveness import unsent
from jobs.queue import EPISODE_TASK, GRADE_TASK, get_app, send

log = logging.getLogger(__name__)
#: how a job's ``error`` begins while some of its episodes are stored but unsent (``resume`` clears it)
UNSENT_NOTE = "not all episodes were sent"


def enqueue_episode(db: Database, episode_id: str, *, app: Celery | None = None) -> str:
    """Send one episode to the ``gpu`` queue and remember the Celery task id on its row.
    ``app``: the process's app by default (``jobs.queue.get_app``)."""
    sent = send(app or get_app(), EPISODE_TASK, (episode_id,))
    with db.session() as s:
        db_store.assign_celery_task(s, episode_id, sent.id)
    return sent.id


def enqueue_pending(db: Database, job_id: str, *, app: Celery | None = None) -> dict[str, int]:
    """Send every newest attempt of ``job_id`` that only a message starts: ``queued`` rows (to ``gpu``) and
    agent exits whose grade nobody started (to ``grade``). What ``submit`` sends; a duplicate is harmless."""
    app = app or get_app()
    with db.session() as s:
        todo = unsent(s, [job_rows.get_job(s, job_id).id])
    for episode_id in todo.runs:
        enqueue_episode(db, episode_id, app=app)
    for episode_id in todo.grades:
        send(app, GRADE_TASK, (episode_id,))
    return {"episodes": len(todo.runs), "grades": len(todo.grades)}


class NotEnqueued(RuntimeError):
    """Episodes of ``job_id`` were stored (``queued``) but not all sent to the broker. Nothing is lost: the
    message names the job and ``nexus-eval resume JOB``, which sends them once the broker answers; the job's
    ``error`` says the same until then."""

    def __init__(self, job_id: str, episode_ids: list[str], cause: Exception) -> None:
        super().__init__(
            f"job {job_id}: {len(episode_ids)} episode(s) are stored (queued) but could not all be sent to the "
            f"queue: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}\n"
            f"nothing is lost: once the broker answers, `nexus-eval resume {job_id}` sends them"
        )
        self.job_id, self.episode_ids = job_id, episode_ids


def note_unsent(db: Database, job_id: str, episode_ids: list[str], cause: Exception) -> NotEnqueued:
    """Record on the job that its episodes were not all sent (``resume`` clears it); the error to raise."""
    error = NotEnqueued(job_id, episode_ids, cause)
    try:
        with db.session() as s:
            job_rows.note_job_error(s, job_id, f"{UNSENT_NOTE}: {error}")
    except Exception as exc:  # the message still names the job and the command
        log.error("could not note the unsent episodes on job %s: %s", job_id, exc)
    return error


def rerun(db: Database, job_id: str, statuses: list[str], *, app: Celery | None = None) -> list[str]:
    """New attempt rows for the job's newest episodes in ``statuses`` (the old rows stay), sent to the ``gpu``
    queue; returns their ids. ``LookupError``/``ValueError`` for a bad job or status; :class:`NotEnqueued` when
    the rows are stored but the broker could not take them all."""
    with db.session() as s:
        job_id = job_rows.get_job(s, job_id).id
        new_ids = [r.id for r in db_store.rerun_job(s, job_id, statuses)]
    try:
        for episode_id in new_ids:
            enqueue_episode(db, episode_id, app=app)
    except Exception as exc:  # the broker: the rows are already stored as queued
        raise note_unsent(db, job_id, new_ids, exc) from exc
    return new_ids


def cancel(
    db: Database, job_id: str, reason: str = "cancelled by user", *, app: Celery | None = None
) -> list[str] | None:
    """Cancel a job: its queued/running episodes become ``cancelled`` in the database (what every worker
    checks), and their Celery messages are revoked. A running episode stops at its next turn. ``None`` when the
    job had nothing queued or running (nothing changed)."""
    with db.session() as s:
        task_ids = job_rows.cancel_job(s, job_id, reason)
    if task_ids:
        try:
            (app or get_app()).control.revoke(task_ids)
        except Exception as exc:  # the database already says cancelled; revoking only saves a no-op delivery
            log.warning("revoke failed (episodes are cancelled in the database anyway): %s", exc)
    return task_ids
