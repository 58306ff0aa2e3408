"""A multi-episode gpu worker: 4 episodes of one job in one worker process, decoded together by its engine.

Real Redis, PostgreSQL, Docker and ``celery worker`` subprocesses (threads pool, $NEXUS_EVAL_EPISODES_PER_GPU=4),
the tiny model on the CPU. Each stored episode must equal the same episode run alone (same completions for the
same seed), and a SIGKILLed multi-episode worker must still leave exactly one result per episode.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from agent_runner.episode import run_episode
from db import store as db_store
from db.process_identity import local_pid
from jobs.episode_config import stored_episode_spec
from tests.conftest import docker_status, require
from tests.support.db_fixtures import pg_db_fixture  # noqa: F401 - the pg_db fixture
from tests.support.worker_fixtures import Worker, cli, fresh_redis_url, job_done, service_env, wait_until, write_job

pytestmark = [pytest.mark.services, pytest.mark.docker, pytest.mark.slow]
TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1", "argkit__argkit-1", "tinyparse__tinyparse-1"]


def _job(tmp_path, steps: int, methods=("nexus",), tasks=TASKS):
    return write_job(
        tmp_path / "job.yaml",
        backend="hf",
        model={"name": "tiny", "device": "cpu"},
        methods=list(methods),
        scopes=["prefill_decode"],
        protocols=["true_eviction"],
        tasks={"suite": "mini", "ids": list(tasks)},
        limits={"max_steps": steps, "soft_step_limit": steps},
        sampling={"max_new_tokens": 24},
    )


def _submit(job_file, env) -> str:
    done = cli("submit", "--file", str(job_file), env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _gpu_worker(env, tmp_path, name: str) -> Worker:
    return Worker(env, "gpu", tmp_path / f"{name}.log", pool="threads", concurrency=4, name=name)


def test_four_episodes_in_one_worker_equal_each_run_alone_and_replay(pg_db, tmp_path):
    require(*docker_status())
    env = service_env(fresh_redis_url(), pg_db.url, NEXUS_EVAL_EPISODES_PER_GPU="4")
    gpu = _gpu_worker(env, tmp_path, "gpu")
    grade = Worker(env, "grade,default", tmp_path / "grade.log", concurrency=2)
    try:
        job_id = _submit(_job(tmp_path, steps=3, methods=("dense", "nexus"), tasks=TASKS[:2]), env)
        wait_until(lambda: job_done(pg_db, job_id), 600, f"job {job_id}", lambda: gpu.tail() + grade.tail())
    finally:
        gpu.stop()
        grade.stop()

    with pg_db.session() as s:
        rows = db_store.episodes_for_job(s, job_id, full=True)
        stored = {r.id: ([t.completion for t in r.turns], [t.extra for t in r.turns], dict(r.config)) for r in rows}
        assert (
            len(rows) == 4 and len({r.result["worker"] for r in rows}) == 1
        )  # one process ran all four (`worker` is the grader now)
        assert all(r.n_claims == 1 for r in rows)
    # the engine really decoded rows together
    assert max(extra.get("batch_rows", 1.0) for _, extras, _ in stored.values() for extra in extras) > 1.0
    for episode_id, (completions, _, config) in stored.items():
        alone = run_episode(stored_episode_spec(config))  # alone: no engine; the one runner applies the seed
        assert [t.completion.text for t in alone.turns] == completions, episode_id

    # the stored token streams replay: nexus against dense on the dense trajectories, shown by compare
    replayed = cli("replay", job_id, "--methods", "nexus", env=env, timeout=600)
    assert replayed.returncode == 0, replayed.stderr
    compared = cli("compare", job_id, "--format", "json", env=env)
    assert compared.returncode == 0, compared.stderr
    cells = {c["method"]: c for c in json.loads(compared.stdout)["replay"]}
    assert set(cells) == {"dense", "nexus"} and cells["nexus"]["tasks"] == 2 and cells["nexus"]["n_pairs"] == 2
    assert cells["dense"]["top1"] is not None and cells["nexus"]["delta_nll"] is not None


def test_killed_multi_episode_worker_leaves_one_result_per_episode(pg_db, tmp_path):
    require(*docker_status())
    env = service_env(
        fresh_redis_url(),
        pg_db.url,
        NEXUS_EVAL_EPISODES_PER_GPU="4",
        NEXUS_EVAL_SOFT_TIME_LIMIT="60",
        NEXUS_EVAL_HARD_TIME_LIMIT="70",
        NEXUS_EVAL_VISIBILITY_TIMEOUT="80",  # Redis hands the dead worker's unacked messages out again after this
    )
    first = _gpu_worker(env, tmp_path, "first")
    grade = Worker(env, "grade,default", tmp_path / "grade.log", concurrency=2)
    second = None
    try:
        # twelve steps: the four episodes decode together for ~20 s, a wide window for the kill
        job_id = _submit(_job(tmp_path, steps=12), env)

        def running_with_a_turn() -> list:
            with pg_db.session() as s:
                rows = db_store.episodes_for_job(s, job_id, full=True)
                return [r for r in rows if r.status == "running" and r.turns]

        def evidence() -> str:  # an attempt that failed first (a container that did not start) is shown with its error
            with pg_db.session() as s:
                rows = db_store.episodes_for_job(s, job_id, full=True)
                lines = [f"{r.id} {r.status} turns={len(r.turns)} error={r.error!r}" for r in rows]
            return "\n".join(lines) + "\n" + first.tail()

        wait_until(lambda: len(running_with_a_turn()) == 4, 300, "four running episodes", evidence)
        running = running_with_a_turn()
        victims = {r.worker for r in running}
        killed = {r.id for r in running}
        assert {local_pid(v) for v in victims} == {first.process.pid}  # all four in the one process, on this host
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        second = _gpu_worker(env, tmp_path, "second")
        wait_until(lambda: job_done(pg_db, job_id), 420, f"job {job_id} after the kill", second.tail)
    finally:
        first.stop()
        grade.stop()
        if second is not None:
            second.stop()

    with pg_db.session() as s:
        rows = {r.id: r for r in db_store.episodes_for_job(s, job_id, full=True)}
        newest = db_store.latest_attempts(s, [job_id])
        assert len(newest) == 4  # one result per episode key: redelivery made no second row
        for episode_id in killed:
            row = rows[episode_id]
            assert row.n_claims == 2 and row.worker not in victims and row.result["took_over_from"] in victims
            assert row.status in {"resolved", "unresolved", "empty_patch", "patch_failed", "timeout"}
            assert len(row.turns) == row.n_turns  # the dead run's partial turns were replaced
        # any other row is an attempt that failed before the kill and was retried as a new attempt
        assert all(rows[i].status == "infra_failure" for i in set(rows) - killed)
