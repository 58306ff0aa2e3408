"""The no-service default: run a job on this machine through the same Celery tasks, with no Redis.

:class:`EmbeddedWorker` starts a real ``celery worker`` in a child process on the embedded broker (a
SQLite file through kombu's SQLAlchemy transport, see :mod:`jobs.settings`) and the local results database.
The child process matters: the model then lives in the worker process exactly as on a GPU node, and the
parent never calls ``AsyncResult.get()`` from inside a worker (Celery forbids that); it polls the database,
which is the source of truth anyway.

:func:`wait_for_job` polls a job until it is finished, calling back on every poll: the CLI draws its progress
there (nexus_eval/commands/_job_progress.py, shared by ``run`` and ``status --watch``); :func:`progress_table`
is the job's status table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from db import Database, job_rows
from db.models import ACTIVE_STATUSES, GRADE_STATUSES, SERVICE_FAILURE_STATUSES

WORKER_QUEUES = "gpu,grade,default"
#: an attempt nothing more will happen to: graded, or its run failed or was cancelled
ENDED_STATUSES = GRADE_STATUSES | SERVICE_FAILURE_STATUSES


def worker_command(
    queues: str, *, name: str, pool: str = "solo", concurrency: int = 1, loglevel: str = "WARNING", extra=()
) -> list[str]:
    """The command line of a ``celery worker`` child process on this project's app (``workers.celery_app``)."""
    return [
        *(sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", queues, "-n", name),
        *("--pool", pool, "--concurrency", str(concurrency), "--loglevel", loglevel),
        *("--without-gossip", "--without-mingle", *extra),
    ]


class EmbeddedWorker:
    """A ``celery worker`` child process for the embedded broker; use as a context manager."""

    def __init__(
        self,
        db_url: str,
        *,
        queues: str = WORKER_QUEUES,
        log_file: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.db_url, self.queues = db_url, queues
        self.log_file = log_file
        self.extra_env = dict(extra_env or {})
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        # solo pool: one process, the model loaded once in it; the soft deadline is enforced by
        # workers.execution at turn boundaries (Celery's own time limits need the prefork pool)
        return worker_command(self.queues, name=f"embedded-{os.getpid()}@%h")

    def start(self) -> EmbeddedWorker:
        env = {**os.environ, "NEXUS_EVAL_DB": self.db_url, **self.extra_env}
        env.pop("NEXUS_EVAL_BROKER", None)  # embedded means the SQLite broker, whatever the shell says
        env.pop("NEXUS_EVAL_RESULT_BACKEND", None)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        root = Path(__file__).resolve().parent.parent
        self.process = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not stop in ``timeout`` seconds."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> EmbeddedWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def progress_table(db: Database, job_id: str):
    """A rich Table: one row per method x scope x protocol with counts per status of each key's result attempt (the
    rule ``compare`` counts by, ``db.attempt_roles``), ``done`` = keys whose result is final, and the attempts kept
    apart (resamples, interactive, steered) in their own column. Redrawn every second by ``status --watch`` and
    ``run``: one GROUP BY (``db.progress.group_counts``), no episode row loaded."""
    from rich.table import Table

    from db.attempt_roles import APART_ROLES, Role, apart_text
    from db.progress import group_counts

    with db.session() as s:
        job = job_rows.get_job(s, job_id)
        groups = group_counts(s, job.id)
        job_status = job.status
    results = {group: by.get(Role.result.value, Counter()) for group, by in groups.items()}
    statuses = sorted({st for c in results.values() for st in c}, key=lambda st: (st not in ACTIVE_STATUSES, st))
    apart = any(by.get(r.value) for by in groups.values() for r in APART_ROLES)
    table = Table(title=f"job {job_id}: {job_status}")
    for col in ("method", "scope", "protocol", *statuses, "done", *(["apart"] if apart else [])):
        table.add_column(col, justify="left" if col in ("method", "scope", "protocol", "apart") else "right")
    for (method, scope, protocol), counts in sorted(results.items()):
        total = sum(counts.values())
        done = total - sum(counts[a] for a in ACTIVE_STATUSES)
        cells = [method, scope, protocol, *(str(counts.get(st, 0)) for st in statuses), f"{done}/{total}"]
        if apart:
            cells.append(apart_text(groups[(method, scope, protocol)]))
        table.add_row(*cells)
    return table


def job_finished(db: Database, job_id: str) -> bool:
    """No attempt a view shows (each key's result, resamples, interactive and steered attempts) is queued, running
    or awaiting its grade, or the job is cancelled/failed. Asked on every poll: one GROUP BY over those attempts'
    statuses (``db.progress.status_counts``)."""
    from db.progress import status_counts

    with db.session() as s:
        job = job_rows.get_job(s, job_id)
        if job.status in ("cancelled", "failed"):
            return True
        return all(status in ENDED_STATUSES for status in status_counts(s, job.id))


def wait_for_job(
    db: Database,
    job_id: str,
    *,
    on_poll: Callable[[], object] = lambda: None,
    worker: EmbeddedWorker | None = None,
    interval: float = 1.0,
    timeout: float | None = None,
) -> bool:
    """Poll every ``interval`` seconds until the job is finished, calling ``on_poll()`` first on every poll (the
    last one included). Returns False on timeout or when the embedded ``worker`` died first (its exit code is
    then in ``worker.process.returncode``)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        on_poll()
        if job_finished(db, job_id):
            return True
        if worker is not None and not worker.alive():
            return False
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(interval)
