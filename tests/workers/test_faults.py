"""Fault tests against real Redis, PostgreSQL, Docker and ``celery worker`` subprocesses.

- a worker process SIGKILLed mid-episode: the message is redelivered, the episode is taken over and ends
  with exactly one result row, and the dead run's container is gone;
- Redis restarted mid-job: the job still completes;
- two workers and a duplicate message per episode: no episode is ever claimed twice;
- a malformed job file: a clear error and nothing enqueued.
"""

from __future__ import annotations

import subprocess

import pytest
from sqlalchemy import func, select

from db import store as db_store
from db.models import Job, Turn
from db.process_identity import local_pid
from tests.conftest import docker_status, require
from tests.support.db_fixtures import pg_db_fixture  # noqa: F401 - the pg_db fixture
from tests.support.worker_fixtures import (
    Worker,
    cli,
    fresh_redis_url,
    job_done,
    oracle_job,
    service_env,
    submit_file,
    tiny_job,
    wait_until,
    write_job,
)

pytestmark = [pytest.mark.services, pytest.mark.docker, pytest.mark.slow]
TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1"]


def _containers(job_id: str) -> list[str]:
    import docker

    client = docker.from_env(timeout=30)
    return [
        c.id
        for c in client.containers.list(all=True, ignore_removed=True, filters={"label": f"nexus-eval.job={job_id}"})
    ]


def _turn_count(s, episode_id: str) -> int:
    return s.execute(select(func.count(Turn.id)).where(Turn.episode_id == episode_id)).scalar_one()


def test_sigkilled_worker_mid_episode_is_redelivered_with_exactly_one_result(pg_db, tmp_path):
    require(*docker_status())
    env = service_env(fresh_redis_url(), pg_db.url)
    # the tiny model makes each turn take a second or two: a wide window to kill the process mid-episode
    job = write_job(
        tmp_path / "job.yaml",
        **tiny_job(TASKS[:1]),
    )
    gpu = Worker(env, "gpu", tmp_path / "gpu.log")
    grade = Worker(env, "grade,default", tmp_path / "grade.log")
    try:
        job_id = submit_file(job, env)
        with pg_db.session() as s:
            (episode_id,) = [r.id for r in db_store.episodes_for_job(s, job_id, full=True)]

        def first_turn_stored() -> bool:
            with pg_db.session() as s:
                return _turn_count(s, episode_id) >= 1

        wait_until(first_turn_stored, 300, "the first turn", gpu.tail)
        with pg_db.session() as s:
            victim = db_store.get_episode(s, episode_id).worker
        pid = local_pid(victim)  # hostname/pid/kernel: this host's
        assert pid in gpu.children()  # the pool process that holds the model and runs the episode
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
        wait_until(lambda: job_done(pg_db, job_id), 300, f"job {job_id} after the kill", lambda: gpu.tail())
    finally:
        gpu.stop()
        grade.stop()

    with pg_db.session() as s:
        rows = db_store.episodes_for_job(s, job_id, full=True)
        assert len(rows) == 1  # redelivery made no second row
        row = rows[0]
        assert row.n_claims == 2 and row.worker != victim  # taken over from the dead process
        assert row.status in {"resolved", "unresolved", "empty_patch", "patch_failed"}
        assert _turn_count(s, episode_id) == row.n_turns == 4  # the dead run's partial turns were replaced
        assert row.result["took_over_from"] == victim
    assert _containers(job_id) == []


def test_two_workers_never_run_the_same_episode_twice(pg_db, tmp_path):
    require(*docker_status())
    broker = fresh_redis_url()
    env = service_env(broker, pg_db.url)
    job = write_job(tmp_path / "job.yaml", **oracle_job(TASKS, ["dense", "snapkv", "nexus"], ["true_eviction"]))
    workers = [Worker(env, "gpu", tmp_path / f"gpu{i}.log", name=f"gpu{i}") for i in range(2)]
    workers.append(Worker(env, "grade,default", tmp_path / "grade.log", concurrency=2))
    try:
        job_id = submit_file(job, env)
        # a second message for every episode, as a redelivery or a double submit would produce
        dup = subprocess.run(
            [
                "python",
                "-c",
                f"from db import connect; from jobs.control import enqueue_pending; "
                f"print(enqueue_pending(connect({pg_db.url!r}), {job_id!r}))",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dup.returncode == 0, dup.stderr
        wait_until(lambda: job_done(pg_db, job_id), 300, f"job {job_id}", lambda: workers[0].tail())
    finally:
        for w in workers:
            w.stop()

    with pg_db.session() as s:
        rows = db_store.episodes_for_job(s, job_id, full=True)
        assert len(rows) == 6
        for r in rows:
            assert r.n_claims == 1, (r.id, r.n_claims)  # the duplicate delivery got no claim
            assert r.status == "resolved" and _turn_count(s, r.id) == 3
    ran_on = {r.worker.split("/")[1] for r in rows}
    assert ran_on  # (both workers may or may not have been needed; no episode ran twice either way)


def test_malformed_job_file_is_a_clear_error_and_nothing_is_enqueued(pg_db, tmp_path):
    import redis as redis_py

    broker = fresh_redis_url()
    env = service_env(broker, pg_db.url)
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [dense, turbo]\ntasks: {suite: mini}\nbackend: oracle\n")
    done = cli("submit", "--file", str(bad), env=env)
    assert done.returncode == 2
    assert str(bad) in done.stderr and "methods" in done.stderr and "turbo" in done.stderr
    assert "nothing was submitted" in done.stderr
    client = redis_py.Redis.from_url(broker)
    assert [client.llen(q) for q in ("gpu", "grade", "default")] == [0, 0, 0]
    with pg_db.session() as s:
        assert s.execute(select(func.count(Job.id))).scalar_one() == 0


def test_soft_time_limit_keeps_the_partial_trajectory_and_marks_timeout(pg_db, tmp_path):
    require(*docker_status())
    env = service_env(
        fresh_redis_url(),
        pg_db.url,
        NEXUS_EVAL_SOFT_TIME_LIMIT="20",
        NEXUS_EVAL_HARD_TIME_LIMIT="120",
        NEXUS_EVAL_VISIBILITY_TIMEOUT="180",
    )
    job = write_job(
        tmp_path / "job.yaml",
        **tiny_job(TASKS[:1], limits={"max_steps": 100, "soft_step_limit": 40, "max_format_errors": 100}),
    )
    gpu = Worker(env, "gpu", tmp_path / "gpu.log")
    try:
        job_id = submit_file(job, env)
        wait_until(lambda: job_done(pg_db, job_id), 240, f"job {job_id}", gpu.tail)
    finally:
        gpu.stop()
    with pg_db.session() as s:
        (row,) = db_store.episodes_for_job(s, job_id, full=True)
        assert row.status == "timeout" and "soft time limit" in row.error
        assert 1 <= row.n_turns < 100 and _turn_count(s, row.id) == row.n_turns  # the turns so far are kept
    assert _containers(job_id) == []
