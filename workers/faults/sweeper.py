"""The sweeper: a thread in every worker's main process that keeps the service's promises after faults.

Every ``sweep_s`` seconds it (1) asks Docker whether it answers and writes this worker's row in the
``workers`` table (``ok``, or ``paused`` with the reason: ``doctor``, ``status`` and the dashboard read it) and marks
``gone`` the rows of workers silent for ``Liveness.worker_gone_after_s`` (``db.worker_rows``), and (2) runs
``workers.faults.recovery.sweep``: episodes whose holder is gone are sent again, leftover containers removed. Its first
sweep is ``recover_at_start`` (on the embedded broker it also resends what the killed worker had taken).

A database outage only makes a sweep fail (logged); the next one tries again. The thread opens its own
database connection and closes it after each sweep, so no socket is shared with a pool process forked later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from db import connect
from db.process_identity import worker_identity
from db.session_bounds import WORKER_BOUNDS
from db.worker_rows import mark_gone_workers, report_worker
from jobs.settings import Liveness
from workers.faults.recovery import Send, recover_at_start, sweep

log = logging.getLogger(__name__)


class Sweeper(threading.Thread):
    def __init__(
        self,
        db_url: str,
        liveness: Liveness,
        *,
        queues: str,
        send_run: Send,
        send_grade: Send,
        embedded: bool,
        docker_check: Callable[[], str | None],
    ) -> None:
        super().__init__(name="nexus-sweeper", daemon=True)
        self.db_url, self.liveness, self.queues = db_url, liveness, queues
        self.send_run, self.send_grade, self.embedded = send_run, send_grade, embedded
        self.docker_check = docker_check
        self.name_in_db = worker_identity()
        self.stopping = threading.Event()
        self.sweeps = 0

    def sweep_once(self) -> None:
        # the tasks migrate; a sweep before that fails and is retried
        db = connect(self.db_url, upgrade=False, bounds=WORKER_BOUNDS)
        try:
            down = self.docker_check()
            with db.session() as s:
                report_worker(s, self.name_in_db, queues=self.queues, state="paused" if down else "ok", detail=down)
                gone = mark_gone_workers(s, silent_s=self.liveness.worker_gone_after_s)
            if gone:
                log.warning("workers gone (no report for %.0f s): %s", self.liveness.worker_gone_after_s, gone)
            senders = {"send_run": self.send_run, "send_grade": self.send_grade}
            if self.sweeps == 0:
                done = recover_at_start(db, self.liveness, embedded=self.embedded, **senders)
            else:
                done = sweep(db, self.liveness, docker_up=down is None, **senders)
            if done:
                log.warning("sweep: %s", done.describe())
        finally:
            db.dispose()
        self.sweeps += 1

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sweep_once()
                wait = self.liveness.sweep_s
            except Exception as exc:  # a database or broker outage: try again soon
                log.warning("sweep failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                wait = min(self.liveness.sweep_s, 5.0)
            self.stopping.wait(wait)

    def stop(self) -> None:
        self.stopping.set()
