"""Telling "Docker is down" from "this episode failed".

Every episode and every grade needs containers. While Docker does not answer, a worker that kept taking
episodes would record each as an ``infra_failure`` in a second and burn the whole queue. So each task first
:func:`wait_for_docker`: it backs off (1 s doubling to 30 s) while ``docker info`` fails, logging when the
Docker goes away and when it comes back, and after ``docker_wait_s`` the task requeues its message instead
of running (``workers.celery_tasks``). The worker's sweeper reports the same state in the ``workers`` table
(``paused``), which ``doctor`` and the dashboard show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class DockerDown(RuntimeError):
    """Docker did not answer within the wait; the message is requeued, nothing is recorded."""


def docker_down(timeout_s: float = 5.0) -> str | None:
    """``None`` when Docker answers a ping, else the reason in one line."""
    from env.sandbox.docker_daemon import daemon_state

    state = daemon_state(timeout=timeout_s)
    return None if state.answering else f"Docker at {state.host} does not answer: {state.reason}"


def wait_for_docker(
    budget_s: float,
    *,
    what: str,
    probe: Callable[[], str | None] = docker_down,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Return once Docker answers; raise :class:`DockerDown` after ``budget_s`` seconds without it."""
    reason = probe()
    if reason is None:
        return
    started, wait = clock(), 1.0
    log.warning("%s waits: %s; this worker takes no episode until it answers", what, reason)
    while clock() - started + wait <= budget_s:
        sleep(wait)
        wait = min(wait * 2, 30.0)
        reason = probe()
        if reason is None:
            log.warning("%s: Docker answers again after %.0f s", what, clock() - started)
            return
    raise DockerDown(f"{what}: {reason} (waited {clock() - started:.0f} s)")
