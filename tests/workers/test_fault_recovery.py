"""The service survives its own dependencies: one test per fault of docs/service.md's "Faults" table.

Each runs real ``celery worker`` processes against real Redis, PostgreSQL, the embedded SQLite broker and a
Docker engine, provokes the fault mid-job, and ends with every episode finished exactly once: one newest
result per episode key, nothing ``queued`` or ``running``, the job ``done``, no container of the job left.
A test that restarts a daemon restarts its own instance (``tests.support.own_services``), never the shared one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from sqlalchemy import func, select

from db import connect, job_rows, sqlite_url
from db import store as db_store
from db.models import Turn
from tests.conftest import docker_status, require
from tests.support.db_fixtures import pg_db_fixture  # noqa: F401 - the pg_db fixture
from tests.support.own_services import OwnDockerd, OwnRedis, mini_task_images
from tests.support.worker_fixtures import (
    Worker,
    cli,
    fresh_redis_url,
    job_done,
    oracle_job,
    service_env,
    submit_file,
    wait_first_finished,
    wait_until,
    write_job,
)

pytestmark = [pytest.mark.services, pytest.mark.docker, pytest.mark.slow]
TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1"]
FOUR_METHODS = ["dense", "snapkv", "nexus", "streaming_llm"]
# short liveness so a test sees a takeover in seconds (the defaults are 15 s beats, 150 s bound, 30 s sweeps)
FAST = {
    "NEXUS_EVAL_HEARTBEAT": "2",
    "NEXUS_EVAL_STALE_AFTER": "12",
    "NEXUS_EVAL_SWEEP": "3",
    "NEXUS_EVAL_DB_RETRY": "90",
    "NEXUS_EVAL_DOCKER_WAIT": "120",
}


def _docker(host: str | None = None):
    import docker

    return docker.DockerClient(base_url=host, timeout=30) if host else docker.from_env(timeout=30)


def _containers(job_id: str, host: str | None = None, **labels: str) -> list:
    wanted = [f"nexus-eval.job={job_id}", *(f"{k}={v}" for k, v in labels.items())]
    return _docker(host).containers.list(all=True, ignore_removed=True, filters={"label": wanted})


def _quietly(condition):
    """A wait condition that reads the database: while it is down, the answer is "not yet"."""

    def check() -> bool:
        try:
            return condition()
        except Exception:  # the database is the fault under test
            return False

    return check


def status_counts(db, job_id: str) -> str:
    """The job's status and its episodes' statuses (newest attempts, and all attempts): the evidence line."""
    from collections import Counter

    with db.session() as s:
        job = job_rows.get_job(s, job_id)
        newest = Counter(r.status for r in db_store.latest_attempts(s, [job_id], full=True))
        every = Counter(r.status for r in db_store.episodes_for_job(s, job_id, full=True))
        return f"job {job.status}; newest {dict(sorted(newest.items()))}; attempts {dict(sorted(every.items()))}"


def _evidence(db, job_id: str, *workers: Worker):
    """What a timed-out wait shows: the status counts (the before/after evidence), then the workers' logs."""

    def show() -> str:
        try:
            counts = status_counts(db, job_id)
        except Exception as exc:  # the database may be the fault
            counts = f"(unreadable: {exc})"
        return f"STATUS {counts}\n" + "\n".join(w.tail() for w in workers)

    return show


def _kill_group(worker: Worker) -> None:
    os.killpg(worker.process.pid, signal.SIGKILL)  # the main process and its pool: a crashed machine
    worker.process.wait(10)


def assert_finished_exactly_once(db, job_id: str, *, n_keys: int, host: str | None = None, verdicts=("resolved",)):
    """One newest attempt per key, each with a verdict in ``verdicts``, its turns stored once; nothing queued or
    running; job done; no container of the job left. Returns every attempt row."""
    print(f"AFTER job {job_id}: {status_counts(db, job_id)}")  # the evidence line (pytest -s shows it)
    with db.session() as s:
        job = job_rows.get_job(s, job_id)
        rows = db_store.episodes_for_job(s, job_id, full=True)
        newest = db_store.latest_attempts(s, [job_id], full=True)
        assert job.status == "done", job.status
        assert len(newest) == len({r.episode_key for r in rows}) == n_keys
        assert [r.status for r in rows if r.status in ("queued", "running")] == []
        assert {r.status for r in newest} <= set(verdicts), [(r.id, r.status, r.error) for r in newest]
        for r in newest:
            stored = s.execute(select(func.count(Turn.id)).where(Turn.episode_id == r.id)).scalar_one()
            assert stored == r.n_turns
    wait_until(lambda: _containers(job_id, host) == [], 30, f"job {job_id}'s containers to be removed")
    return rows


def test_embedded_worker_killed_mid_episode_and_mid_grade_recovers_at_its_next_start(tmp_path):
    """Fault 2: the embedded SQLite broker never redelivers; the restarted worker's first sweep does."""
    require(*docker_status())
    url = sqlite_url(tmp_path / "nexus-eval.db")
    env = {**os.environ, "NEXUS_EVAL_DB": url, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **FAST}
    env.pop("NEXUS_EVAL_BROKER", None)
    env.pop("NEXUS_EVAL_RESULT_BACKEND", None)
    job = write_job(tmp_path / "job.yaml", **oracle_job(TASKS, ["dense"], ["true_eviction"]))
    job_id = submit_file(job, env)
    db = connect(url)
    workers: list[Worker] = []

    def start() -> Worker:
        workers.append(Worker(env, "gpu,grade,default", tmp_path / f"w{len(workers)}.log", pool="solo"))
        return workers[-1]

    try:
        first = start()
        _poll(lambda: _agent_box(job_id), 120, "an agent container", first.tail)
        _kill_group(first)
        with db.session() as s:
            assert [r.status for r in db_store.episodes_for_job(s, job_id, full=True)].count("running") == 1
        second = start()
        grading = lambda: _containers(job_id, **{"nexus-eval.role": "grade"}) != []  # noqa: E731
        _poll(grading, 120, "a grading box", _evidence(db, job_id, second))
        _kill_group(second)
        with db.session() as s:
            assert any(r.status == "submitted" for r in db_store.episodes_for_job(s, job_id, full=True))
        third = start()
        wait_until(lambda: job_done(db, job_id), 180, f"job {job_id}", _evidence(db, job_id, third))
    finally:
        for w in workers:
            w.stop()
    rows = assert_finished_exactly_once(db, job_id, n_keys=2)
    assert max(r.n_claims for r in rows) >= 2  # the killed run was taken over, not run beside itself
    assert "run's holder" in second.tail(10**6) and "grade's holder" in third.tail(10**6)  # both were handed back
    db.dispose()


def _poll(condition, timeout: float, what: str, on_timeout) -> None:
    """``wait_until`` at 20 Hz: an oracle episode's container lives about a second."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{on_timeout()}")
        time.sleep(0.05)


def _paused(db) -> list[str]:
    """The details of the workers that report themselves paused (what doctor and the dashboard show)."""
    try:
        from db.worker_rows import recent_workers
    except ImportError:  # a version without worker rows (the test is then failing anyway)
        return []
    with db.session() as s:
        return [w.detail or "" for w in recent_workers(s, within_s=30) if w.state == "paused"]


def _agent_box(job_id: str) -> bool:
    """An episode's own container (not a grading one) of ``job_id`` exists."""
    return any("nexus-eval.role" not in box.labels for box in _containers(job_id))


def test_docker_restart_pauses_the_worker_and_retries_infra_failures(pg_db, tmp_path):
    """Fault 4: while the engine is down no episode is taken; one cut short is retried as a new attempt."""

    with OwnDockerd() as engine:
        engine.load_images(mini_task_images(TASKS))
        env = service_env(fresh_redis_url(), pg_db.url, DOCKER_HOST=engine.host, **FAST)
        job = write_job(tmp_path / "job.yaml", **oracle_job(TASKS, FOUR_METHODS, ["true_eviction"]))
        gpu = Worker(env, "gpu", tmp_path / "gpu.log")
        grade = Worker(env, "grade,default", tmp_path / "grade.log")
        paused_seen: list[str] = []
        try:
            job_id = submit_file(job, env)

            wait_first_finished(pg_db, job_id, gpu)
            engine.stop()
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:  # what doctor and the dashboard read meanwhile
                paused_seen += _paused(pg_db)
                time.sleep(1)
            engine.start()
            wait_until(lambda: job_done(pg_db, job_id), 300, f"job {job_id}", _evidence(pg_db, job_id, gpu, grade))
        finally:
            gpu.stop()
            grade.stop()
        rows = assert_finished_exactly_once(pg_db, job_id, n_keys=8, host=engine.host)
        logs = gpu.tail(10**6) + grade.tail(10**6)
        assert "takes no episode until it answers" in logs
        assert paused_seen and "does not answer" in paused_seen[0]
        retried = [r for r in rows if r.status == "infra_failure"]
        assert len(rows) == 8 + len(retried)  # each infra failure kept as an attempt, followed by one retry
        for r in rows:
            if r.attempt > 1:
                assert r.result["retry_of"] in {x.id for x in retried}


def test_a_lost_send_names_the_job_and_resume_finishes_it(pg_db, tmp_path):
    """Fault 5: rows stored, messages refused; `submit` names the job and `resume`; the job ends done."""
    require(*docker_status())
    with OwnRedis() as redis:
        env = service_env(redis.url, pg_db.url, **FAST)
        acl = ["redis-cli", "-p", str(redis.port), "ACL", "SETUSER", "default"]
        subprocess.run([*acl, "-lpush", "-rpush"], check=True, capture_output=True)  # PING answers, sends fail
        job = write_job(tmp_path / "job.yaml", **oracle_job(TASKS, ["dense", "nexus"], ["true_eviction"]))
        done = cli("submit", "--file", str(job), env=env)
        assert done.returncode == 1, done.stderr
        named = re.search(r"job ([0-9a-f]{8}): 4 episode\(s\) are stored", done.stderr)
        with pg_db.session() as s:
            stored = [status_counts(pg_db, j.id) for j in job_rows.list_jobs(s, limit=5)]
        assert named, f"{done.stderr}\nSTATUS {stored}"
        job_id = named.group(1)
        assert f"nexus-eval resume {job_id}" in done.stderr
        with pg_db.session() as s:
            assert job_rows.get_job(s, job_id).status == "pending"  # not failed: its episodes say where it is
            assert {r.status for r in db_store.episodes_for_job(s, job_id, full=True)} == {"queued"}
        subprocess.run([*acl, "+lpush", "+rpush"], check=True, capture_output=True)
        resumed = cli("resume", job_id, env=env)
        assert resumed.returncode == 0, resumed.stderr
        assert "4 sent" in resumed.stdout
        again = cli("resume", job_id, env=env)  # idempotent: a second resume runs nothing twice
        assert again.returncode == 0, again.stderr
        gpu = Worker(env, "gpu", tmp_path / "gpu.log")
        grade = Worker(env, "grade,default", tmp_path / "grade.log")
        try:
            wait_until(lambda: job_done(pg_db, job_id), 300, f"job {job_id}", _evidence(pg_db, job_id, gpu, grade))
        finally:
            gpu.stop()
            grade.stop()
    rows = assert_finished_exactly_once(pg_db, job_id, n_keys=4)
    assert all(r.n_claims == 1 for r in rows)
    with pg_db.session() as s:
        assert job_rows.get_job(s, job_id).error is None
