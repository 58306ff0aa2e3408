"""The Celery tasks: thin wrappers over :mod:`workers.execution` and :mod:`workers.grade_stored`, plus enqueueing and
cancelling a job.

- ``nexus.episode(episode_id)`` (queue ``gpu``): claim, run, store every turn, finish; then hand the
  patch to ``nexus.grade`` (queue ``grade``). A duplicate or redelivered message finds the episode
  claimed or finished and returns without doing anything; a cancelled job's episodes do nothing either.
- ``nexus.grade(episode_id)`` (queue ``grade``): grade the stored patch in a fresh container.
- ``nexus.resume_job(job_id)`` (queue ``default``): what ``nexus-eval resume JOB`` does (:func:`resume`).

Faults (docs/service.md, "Faults"): each task waits for Docker before it takes an episode, retries
its database calls, and requeues its message when either stays down (never acknowledged into nothing); an
``infra_failure`` is retried as a new attempt; every worker's main process runs a sweeper
(``workers.faults.sweeper``) that sends again what a gone worker held. An episode task first marks its ``queued`` row
as taken by this worker (``db.taken_messages``), so that a sweeper sends it again if the worker dies before its claim.

The task arguments are ids only: the episode's config lives in its database row, so a message can never
carry a stale copy. Each worker process opens the database once (lazily, after the fork) and loads each task
source once (``env.tasks.task_cache``). Worker-host settings (episodes per GPU, the device, the allow-lists...) come
from the app's ``ServiceSettings`` and are passed down as one ``workers.execution.WorkerContext``.

The tasks are ``shared_task``s: they bind to whichever app the process built (``jobs.queue.get_app``), so
importing this module builds nothing. Senders publish by task name through an explicit app.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, Task, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded, TimeLimitExceeded
from celery.signals import worker_init, worker_ready, worker_shutting_down

from agent_runner.status import status_of
from db import Database, connect
from db import store as db_store
from db.models import EpisodeStatus, utcnow
from db.process_identity import worker_identity
from db.session_bounds import WORKER_BOUNDS
from db.taken_messages import clear_taken, note_taken
from env.tasks.task_cache import TaskCache
from jobs.control import enqueue_episode
from jobs.queue import EPISODE_TASK, GRADE_TASK, PING_TASK, RESUME_TASK, get_app, send
from workers.execution import EpisodeHooks, WorkerContext, execute_episode
from workers.faults.db_retry import DatabaseStillDown, retrying
from workers.faults.docker_gate import DockerDown, docker_down, wait_for_docker
from workers.faults.recovery import resume_job, retry_infra_failure
from workers.faults.sweeper import Sweeper
from workers.grade_stored import grade_stored_episode

log = logging.getLogger(__name__)
_DB: dict[str, Database] = {}
_DB_LOCK = threading.Lock()  # a multi-episode (threads pool) worker asks from several threads at once (also _TASKS)
_TASKS: TaskCache | None = None  # this process's task sources, each loaded once (episodes and grades alike)
#: the worker's main process as its ``workers`` row names it (its sweeper writes that row), noted before the pool forks
_MAIN_PROCESS: list[str] = []


@worker_init.connect
def _note_main_process(**_kwargs) -> None:
    """Celery sends ``worker_init`` in the worker's main process before it starts the pool, so every pool process
    (forked later) inherits the name."""
    _MAIN_PROCESS[:] = [worker_identity()]


def _taker() -> str:
    """Who takes a message here: the worker's main process (a pool process killed alone gets its message requeued by
    Celery; the main process or its host dying is what leaves a message taken and nothing claimed)."""
    return _MAIN_PROCESS[0] if _MAIN_PROCESS else worker_identity()


def _mark_taken(app: Celery, episode_id: str, *, taken: bool) -> None:
    """Best effort: mark ``episode_id``'s queued row as taken by this worker (``taken``), or clear this worker's mark
    (its message goes back to the broker). A database that does not answer is logged, never fails the task: the
    claim retries on its own, and without the mark only the sweeper's early re-send is lost."""
    try:
        with database(app).session() as s:
            if taken:
                note_taken(s, episode_id, _taker(), utcnow())
            else:
                clear_taken(s, [episode_id], taken_by=_taker())
    except Exception as exc:
        log.warning("episode %s: could not %s its message as taken: %s", episode_id, "mark" if taken else "unmark", exc)


def _tasks(app: Celery) -> TaskCache:
    """The process's one ``TaskCache``, under the worker's grading ceilings (made on first use, after the fork)."""
    global _TASKS
    with _DB_LOCK:
        if _TASKS is None:
            _TASKS = TaskCache(app.conf.nexus_settings.grading_ceilings)
        return _TASKS


def database(app: Celery) -> Database:
    """This process's connection to ``app``'s results database, migrated on first use; on PostgreSQL held to the
    worker's session bounds (``db.session_bounds.WORKER_BOUNDS``: a host cut off mid-transaction loses its locks)."""
    url = app.conf.nexus_settings.db_url
    with _DB_LOCK:
        if url not in _DB:
            _DB[url] = connect(url, bounds=WORKER_BOUNDS)
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
        # the grade hand-off: an outage of the broker is ridden out here (jobs.queue.send); a hand-off lost anyway
        # is sent again by the sweeper (workers.faults.recovery.resend_due_grades)
        "send_grade": lambda episode_id: send(app, GRADE_TASK, (episode_id,)),
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
        status = status_of(interrupted=exc, time_limits=(TimeLimitExceeded,))  # the hard limit: timeout
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


@shared_task(name=EPISODE_TASK, bind=True, base=EpisodeTask, acks_late=True, reject_on_worker_lost=True)
def episode_task(self: Task, episode_id: str) -> dict[str, Any]:
    _mark_taken(self.app, episode_id, taken=True)  # before the wait: if this worker dies now, a sweeper resends it
    settings = self.app.conf.nexus_settings
    # our own deadline before Celery's soft limit (10%, at most 5 min), so that a turn boundary usually ends
    # the run cleanly and the diff is taken; Celery's SoftTimeLimitExceeded (raised wherever the code is) is
    # the backstop and also ends as `timeout` with the turns stored so far
    soft = self.request.timelimit[1] if self.request.timelimit and self.request.timelimit[1] else None
    soft = soft or settings.soft_time_limit_s
    try:
        # a worker whose Docker is down takes no episode (it would only record an infra_failure per message)
        wait_for_docker(settings.docker_wait_s, what=f"episode {episode_id}")
        worker = WorkerContext(
            tasks=_tasks(self.app),
            liveness=settings.liveness,
            episodes_per_gpu=settings.episodes_per_gpu,
            device=settings.device,
            allowed=settings.openai_allowed,
            soft_deadline_s=soft - min(0.1 * soft, 300.0),
            celery_task_id=self.request.id,
        )
        hooks = EpisodeHooks(progress=_progress_reporter(self), time_limits=(SoftTimeLimitExceeded,))
        outcome = execute_episode(database(self.app), episode_id, worker=worker, hooks=hooks)
    except (DockerDown, DatabaseStillDown) as exc:
        if isinstance(exc, DockerDown):  # the message goes back to the broker, taken by nobody
            _mark_taken(self.app, episode_id, taken=False)
        raise _requeue(f"episode {episode_id}", exc) from exc
    if outcome.needs_grade:
        _senders(self.app)["send_grade"](episode_id)
    if outcome.written and outcome.status == EpisodeStatus.infra_failure:
        _after_infra_failure(self.app, episode_id)
    return {
        "episode_id": episode_id,
        "ran": outcome.ran,
        "status": outcome.status,
        "reason": outcome.reason,
        "written": outcome.written,
    }


@shared_task(name=GRADE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def grade_task(self: Task, episode_id: str) -> dict[str, Any]:
    settings = self.app.conf.nexus_settings
    try:
        wait_for_docker(settings.docker_wait_s, what=f"grade of {episode_id}")
        worker = WorkerContext(tasks=_tasks(self.app), liveness=settings.liveness)
        status = grade_stored_episode(database(self.app), episode_id, worker=worker, docker_check=docker_down)
    except (DockerDown, DatabaseStillDown) as exc:
        raise _requeue(f"grade of {episode_id}", exc) from exc
    if status == EpisodeStatus.infra_failure:
        _after_infra_failure(self.app, episode_id)
    return {"episode_id": episode_id, "status": status}


@shared_task(name=RESUME_TASK, bind=True, acks_late=True)
def resume_job_task(self: Task, job_id: str) -> dict[str, int]:
    return resume(database(self.app), job_id, app=self.app)


def resume(db: Database, job_id: str, *, app: Celery | None = None) -> dict[str, int]:
    """``nexus-eval resume JOB``: send again every episode of the job that nothing will finish otherwise
    (``workers.faults.recovery.resume_job``); returns counts by kind."""
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
    """Every worker's main process sweeps for stranded episodes (``workers.faults.sweeper``)."""
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
        docker_check=docker_down,
        **_senders(app),
    )
    sweeper.start()
    _SWEEPER.append(sweeper)


@worker_shutting_down.connect
def _stop_sweeper(**_kwargs) -> None:
    for sweeper in _SWEEPER:
        sweeper.stop()


@shared_task(name=PING_TASK)
def ping() -> str:
    return "pong"
