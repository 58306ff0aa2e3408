"""Helpers for the worker tests: real ``celery worker`` subprocesses on real Redis, results in PostgreSQL.

Each test gets its own Redis logical database (flushed first) so leftover messages of another test can
never reach its workers, and the emptied PostgreSQL database of ``tests.support.db_fixtures``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.conftest import require
from workers.embedded import worker_command

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("NEXUS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_ping(url: str) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=2).ping())
    except Exception:  # unreachable means "not available" for require()
        return False


def fresh_redis_url(base: str = REDIS_URL) -> str:
    """A flushed logical database of the test Redis (1..15), so tests never share messages."""
    require(redis_ping(base), f"Redis not reachable at {base}")
    import redis

    url = f"{base.rsplit('/', 1)[0]}/{random.randint(1, 15)}"
    redis.Redis.from_url(url).flushdb()
    return url


def service_env(broker: str, db_url: str, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "NEXUS_EVAL_BROKER": broker,
        "NEXUS_EVAL_DB": db_url,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "NEXUS_EVAL_DEVICE": "cpu",
        **extra,
    }
    env.pop("NEXUS_EVAL_RESULT_BACKEND", None)
    return env


class Worker:
    """A ``celery worker`` subprocess; ``log`` is its output file."""

    def __init__(
        self,
        env: dict[str, str],
        queues: str,
        log: Path,
        *,
        pool: str = "prefork",
        concurrency: int = 1,
        name: str | None = None,
    ) -> None:
        name = name or f"w{random.randint(0, 10**6)}"
        cmd = worker_command(
            queues,
            name=f"{name}@%h",
            pool=pool,
            concurrency=concurrency,
            loglevel="INFO",
            extra=["--without-heartbeat"],
        )
        self.log = log
        self.process = subprocess.Popen(
            cmd,
            env=env,
            cwd=ROOT,
            stdout=open(log, "ab"),  # noqa: SIM115 - the child owns the file for its whole life
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def children(self) -> list[int]:
        """The pool's child processes (prefork): where the episodes run."""
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def write_job(path: Path, **spec) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


def oracle_job(task_ids: list[str], methods: list[str], protocols: list[str], **extra) -> dict:
    return {
        "backend": "oracle",
        "methods": methods,
        "scopes": ["prefill_only"],
        "protocols": protocols,
        "tasks": {"suite": "mini", "ids": task_ids},
        **extra,
    }


def tiny_job(task_ids: list[str], **extra) -> dict:
    """One nexus episode per task on the tiny model (a second or two per turn: a wide window for a fault)."""
    return {
        "backend": "hf",
        "model": {"name": "tiny", "device": "cpu"},
        "methods": ["nexus"],
        "scopes": ["prefill_only"],
        "protocols": ["true_eviction"],
        "tasks": {"suite": "mini", "ids": task_ids},
        "limits": {"max_steps": 4, "soft_step_limit": 4},
        "sampling": {"max_new_tokens": 24},
        **extra,
    }


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nexus_eval.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(condition: Callable[[], bool], timeout: float, what: str, on_timeout: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{on_timeout()}")


def submit_file(job_file: Path, env: dict[str, str]) -> str:
    """``nexus-eval submit --file`` in a subprocess; the job id it printed."""
    done = cli("submit", "--file", str(job_file), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def wait_first_finished(db, job_id: str, worker: Worker, timeout: float = 180) -> None:
    """Until one episode of the job has finished (the moment a fault test strikes)."""
    from db import job_rows

    def one_finished() -> bool:
        with db.session() as s:
            return job_rows.job_summary(s, job_id).finished >= 1

    wait_until(one_finished, timeout, "the first episode", worker.tail)


def job_done(db, job_id: str) -> bool:
    from workers.embedded import job_finished

    return job_finished(db, job_id)
