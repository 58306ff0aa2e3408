"""The Celery tasks: thin wrappers over :mod:`workers.execution`, plus enqueueing and cancelling a job.

- ``nexus.run_episode(episode_id)`` (queue ``gpu``): claim, run, store every turn, finish; then hand the
  patch to ``nexus.grade_episode`` (queue ``grade``). A duplicate or redelivered message finds the episode
  claimed or finished and returns without doing anything; a cancelled job's episodes do nothing either.
- ``nexus.grade_episode(episode_id)`` (queue ``grade``): grade the stored patch in a fresh container.
- ``nexus.resume_job(job_id)`` (queue ``default``): what ``nexus-eval resume JOB`` does (:func:`resume`).

Faults (docs/service.md, "Faults"): each task waits for the Docker engine before it takes an episode, retries
its database calls, and requeues its message when either stays down (never acknowledged into nothing); an
``infra_failure`` is retried as a new attempt; every worker's main process runs a sweeper
(``workers.sweeper``) that sends again what a gone worker held.

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
from celery.exceptions import Reject, SoftTimeLimitExceeded, TimeLimitExceeded
from celery.signals import worker_ready, worker_shutting_down

from db import Database, connect
from db import store as db_store
from db.liveness import unsent
from db.models import EpisodeStatus
from workers.app import get_app
from workers.db_retry import DatabaseUnavailable, retrying
from workers.docker_gate import EngineDown, engine_down, wait_for_engine
from workers.execution import EpisodeHooks, execute_episode, grade_stored_episode
from workers.recovery import UNSENT_NOTE, resume_job, retry_infra_failure
from workers.sweeper import Sweeper
from workers.task_cache import TaskCache

log = logging.getLogger(__name__)
RUN_EPISODE = "nexus.run_episode"
GRADE_EPISODE = "nexus.grade_episode"
RESUME_JOB = "nexus.resume_job"
_DB: dict[str, Database] = {}
_DB_LOCK = threading.Lock()  # a multi-episode (threads pool) worker asks from several threads at once (also _TASKS)
_TASKS: TaskCache | None = None  # this process's task sources, each loaded once (episodes and grades alike)


def _tasks(app: Celery) -> TaskCache:
    """The process's one ``TaskCache``, under the worker's grading ceilings (made on first use, after the fork)."""
    global _TASKS
    with _DB_LOCK:
        if _TASKS is None:
            _TASKS = TaskCache(app.conf.nexus_settings.grading_ceilings)
        return _TASKS


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


def _senders(app: Celery) -> dict[str, Any]:
    return {
        "send_run": lambda episode_id: enqueue_episode(database(app), episode_id, app=app),
        "send_grade": lambda episode_id: app.send_task(GRADE_EPISODE, (episode_id,), retry=True),
    }


def _after_infra_failure(app: Celery, episode_id: str) -> None:
    """The automatic retry of an infra failure (``ServiceSettings.infra_retries``); never fails the task."""
    settings = app.conf.nexus_settings
    try:
        send_run = _senders(app)["send_run"]
        retry_infra_failure(database(app), episode_id, retries=settings.infra_retries, send_run=send_run)
    except Exception as exc:  # `nexus-eval rerun JOB --status infra_failure` does it by hand
        log.error("could not retry the infra_failure of episode %s: %s", episode_id, exc)


def _requeue(what: str, exc: Exception) -> Reject:
    """The message goes back to its queue (never acknowledged into nothing); the episode runs later."""
    log.error("%s: %s; the message is requeued", what, exc)
    return Reject(f"{type(exc).__name__}: {exc}", requeue=True)


class EpisodeTask(Task):
    """Records what the task body could not: the hard time limit killed the process (Celery calls
    ``on_failure`` in the worker's main process then), or the body itself raised."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):  # noqa: ANN001 - Celery's signature
        if not args:
            return
        status = EpisodeStatus.timeout if isinstance(exc, TimeLimitExceeded) else EpisodeStatus.infra_failure
        reason = f"{type(exc).__name__}: {exc} (task {task_id})"

        def write() -> bool:
            with database(self.app).session() as s:
                return db_store.fail_running_episode(s, args[0], status, reason)

        try:
            written = retrying(write, budget_s=self.app.conf.nexus_settings.db_retry_s, what=f"fail {args[0]}")
        except Exception as db_exc:  # the row stays running with a silent heartbeat: a sweeper sends it again
            log.error("could not record %s for episode %s: %s", status, args[0], db_exc)
            return
        if written and status == EpisodeStatus.infra_failure:
            _after_infra_failure(self.app, args[0])


@shared_task(name=RUN_EPISODE, bind=True, base=EpisodeTask, acks_late=True, reject_on_worker_lost=True)
def episode_task(self: Task, episode_id: str) -> dict[str, Any]:
    settings = self.app.conf.nexus_settings
    # our own deadline before Celery's soft limit (10%, at most 5 min), so that a turn boundary usually ends
    # the run cleanly and the diff is taken; Celery's SoftTimeLimitExceeded (raised wherever the code is) is
    # the backstop and also ends as `timeout` with the turns stored so far
    soft = self.request.timelimit[1] if self.request.timelimit and self.request.timelimit[1] else None
    soft = soft or settings.soft_time_limit_s
    try:
        # a worker whose engine is down takes no episode (it would only record an infra_failure per message)
        wait_for_engine(settings.engine_wait_s, what=f"episode {episode_id}")
        outcome = execute_episode(
            database(self.app),
            episode_id,
            tasks=_tasks(self.app),
            celery_task_id=self.request.id,
            soft_deadline_s=soft - min(0.1 * soft, 300.0),
            liveness=settings.liveness,
            episodes_per_gpu=settings.episodes_per_gpu,
            device=settings.device,
            hooks=EpisodeHooks(progress=_progress_reporter(self), time_limits=(SoftTimeLimitExceeded,)),
            allowed=settings.openai_allowed,
        )
    except (EngineDown, DatabaseUnavailable) as exc:
        raise _requeue(f"episode {episode_id}", exc) from exc
    if outcome.needs_grade:
        self.app.send_task(GRADE_EPISODE, (episode_id,), retry=True)
    if outcome.written and outcome.status == EpisodeStatus.infra_failure:
        _after_infra_failure(self.app, episode_id)
    return {
        "episode_id": episode_id,
        "ran": outcome.ran,
        "status": outcome.status,
        "reason": outcome.reason,
        "written": outcome.written,
    }


@shared_task(name=GRADE_EPISODE, bind=True, acks_late=True, reject_on_worker_lost=True)
def grade_task(self: Task, episode_id: str) -> dict[str, Any]:
    settings = self.app.conf.nexus_settings
    try:
        wait_for_engine(settings.engine_wait_s, what=f"grade of {episode_id}")
        status = grade_stored_episode(
            database(self.app), episode_id, tasks=_tasks(self.app), liveness=settings.liveness, engine_check=engine_down
        )
    except (EngineDown, DatabaseUnavailable) as exc:
        raise _requeue(f"grade of {episode_id}", exc) from exc
    if status == EpisodeStatus.infra_failure:
        _after_infra_failure(self.app, episode_id)
    return {"episode_id": episode_id, "status": status}


@shared_task(name=RESUME_JOB, bind=True, acks_late=True)
def resume_job_task(self: Task, job_id: str) -> dict[str, int]:
    return resume(database(self.app), job_id, app=self.app)


def resume(db: Database, job_id: str, *, app: Celery | None = None) -> dict[str, int]:
    """``nexus-eval resume JOB``: send again every episode of the job that nothing will finish otherwise
    (``workers.recovery.resume_job``); returns counts by kind."""
    app = app or get_app()
    done = resume_job(db, job_id, app.conf.nexus_settings.liveness, **_senders(app))
    return {
        "taken_over": len(done.runs),
        "grades_taken_over": len(done.grades),
        "sent": len(done.sent_runs),
        "grades_sent": len(done.sent_grades),
    }


_SWEEPER: list[Sweeper] = []


@worker_ready.connect
def _start_sweeper(sender=None, **_kwargs) -> None:  # noqa: ANN001 - Celery's signal signature
    """Every worker's main process sweeps for stranded episodes (``workers.sweeper``)."""
    app = get_app()
    settings = app.conf.nexus_settings
    try:
        queues = ",".join(sorted(q.name for q in sender.task_consumer.queues))
    except AttributeError:  # a sender without a consumer (a test): the row says so
        queues = "?"
    sweeper = Sweeper(
        settings.db_url,
        settings.liveness,
        queues=queues,
        embedded=settings.embedded,
        engine_check=engine_down,
        **_senders(app),
    )
    sweeper.start()
    _SWEEPER.append(sweeper)


@worker_shutting_down.connect
def _stop_sweeper(**_kwargs) -> None:
    for sweeper in _SWEEPER:
        sweeper.stop()


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
    """Send every newest attempt of ``job_id`` that only a message starts: ``queued`` rows (to ``gpu``) and
    agent exits whose grade nobody started (to ``grade``). What ``submit`` sends; a duplicate is harmless."""
    app = app or get_app()
    with db.session() as s:
        todo = unsent(s, [db_store.get_job(s, job_id).id])
    for episode_id in todo.runs:
        enqueue_episode(db, episode_id, app=app)
    for episode_id in todo.grades:
        app.send_task(GRADE_EPISODE, (episode_id,), retry=True)
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
            db_store.note_job_error(s, job_id, f"{UNSENT_NOTE}: {error}")
    except Exception as exc:  # the message still names the job and the command
        log.error("could not note the unsent episodes on job %s: %s", job_id, exc)
    return error


def rerun(db: Database, job_id: str, statuses: list[str], *, app: Celery | None = None) -> list[str]:
    """New attempt rows for the job's newest episodes in ``statuses`` (the old rows stay), sent to the ``gpu``
    queue; returns their ids. ``LookupError``/``ValueError`` for a bad job or status; :class:`NotEnqueued` when
    the rows are stored but the broker could not take them all."""
    with db.session() as s:
        job_id = db_store.get_job(s, job_id).id
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
        task_ids = db_store.cancel_job(s, job_id, reason)
    if task_ids:
        try:
            (app or get_app()).control.revoke(task_ids)
        except Exception as exc:  # the database already says cancelled; revoking only saves a no-op delivery
            log.warning("revoke failed (episodes are cancelled in the database anyway): %s", exc)
    return task_ids
