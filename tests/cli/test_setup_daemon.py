"""The README's first command on this machine's real daemon: `nexus-eval setup` brings a stopped daemon back,
and a missing task image is rebuilt by `setup` and by `run`'s preflight.

These stop the real dockerd (SIGTERM, then wait until it no longer answers) and always leave a daemon
running (the same `env.sandbox.docker_daemon.ensure_daemon` in a finally block). The base image is never removed; the
task images removed here are rebuilt in seconds."""

from __future__ import annotations

import os
import signal
import time

import pytest

from env.sandbox.docker_daemon import daemon_state, dockerd_pid, ensure_daemon
from tests.conftest import docker_status, require
from tests.support.worker_fixtures import cli

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _client():
    ready, reason = docker_status()
    require(ready, reason)
    from env.tasks.images import docker_client

    return docker_client()


def _env(tmp_path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "NEXUS_EVAL_DB": str(tmp_path / "nexus-eval.db"), "OMP_NUM_THREADS": "1", **extra}
    for var in ("DOCKER_HOST", "NEXUS_EVAL_BROKER", "NEXUS_EVAL_RESULT_BACKEND"):
        env.pop(var, None)
    return env


def _wait(condition, timeout: float, what: str, still=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} {still()}")
        time.sleep(0.5)


def _remove_task_image(client, task_id: str) -> str:
    from env.tasks.images import BASE_IMAGE_TAG, task_image_tag
    from env.tasks.loading import load_suite

    task = next(t for t in load_suite("mini") if t.instance_id == task_id)
    tag = task_image_tag(task, client.images.get(BASE_IMAGE_TAG).id)
    if client.images.list(name=tag):
        client.images.remove(tag, force=True)
    assert not client.images.list(name=tag)
    return tag


def test_setup_starts_a_stopped_daemon(tmp_path):
    """The newcomer's case: dockerd installed, no daemon answering. `setup` starts it, detached, and it
    stays up after setup exits."""
    client = _client()
    require(os.geteuid() == 0, "stopping and starting dockerd needs root")
    left = lambda: [f"{c.short_id} {c.status} {c.labels}" for c in client.containers.list(ignore_removed=True)]  # noqa: E731
    _wait(lambda: not left(), 120, "other containers to finish before stopping the daemon", left)
    pid = dockerd_pid()
    require(pid is not None, "no dockerd pidfile (the daemon is not a local dockerd this test may stop)")
    try:
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: not daemon_state(timeout=2).answering and dockerd_pid() is None, 90, "dockerd to stop")
        result = cli("setup", "--no-task-images", env=_env(tmp_path), timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "(started)" in result.stderr and "ready" in result.stdout
        time.sleep(1)  # still answering once the command that started it has exited
        state = daemon_state()
        assert state.answering, state.reason
        assert dockerd_pid() not in (None, pid)
    finally:
        ensure_daemon(install=False)


def test_setup_rebuilds_a_missing_task_image(tmp_path):
    client = _client()
    tag = _remove_task_image(client, "tinyparse__tinyparse-4")
    ci = cli("setup", "--no-task-images", env=_env(tmp_path), timeout=300)  # what .ci/parts/20-docker.sh runs
    assert ci.returncode == 0 and "task images" not in ci.stderr, ci.stderr[-3000:]
    assert not client.images.list(name=tag)
    result = cli("setup", env=_env(tmp_path), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"built {tag}" in result.stderr
    assert "task images of mini: 16 present (1 built now)" in result.stderr
    assert client.images.list(name=tag)
    again = cli("setup", env=_env(tmp_path), timeout=300)  # ready: nothing to do
    assert again.returncode == 0 and "(0 built now)" in again.stderr


def test_run_builds_a_missing_task_image_first(tmp_path):
    """`run`'s preflight builds an image that is only missing (with the progress bar), then runs the job."""
    from db import connect, job_rows
    from db import store as db_store

    client = _client()
    tag = _remove_task_image(client, "tinyparse__tinyparse-3")
    args = ["--backend", "oracle", "--tasks", "tinyparse__tinyparse-3", "--methods", "dense"]
    args += ["--protocols", "true_eviction", "--timeout", "300"]
    result = cli("run", *args, env=_env(tmp_path), timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"built {tag}" in result.stderr
    assert client.images.list(name=tag)
    db = connect(f"sqlite:///{tmp_path / 'nexus-eval.db'}")
    with db.session() as s:
        (job,) = job_rows.list_jobs(s)
        assert [r.status for r in db_store.latest_attempts(s, [job.id])] == ["resolved"]
    assert "did not run to a verdict" not in result.stderr
