"""A real job through real Redis workers into PostgreSQL: the tiny model, 2 mini tasks, dense and nexus under
both protocols, then ``compare --format json``."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from db import store as db_store
from db.models import Episode, Turn
from tests.conftest import docker_status, require
from tests.support.db_fixtures import pg_db_fixture  # noqa: F401 - the pg_db fixture
from tests.support.worker_fixtures import (
    Worker,
    cli,
    fresh_redis_url,
    job_done,
    service_env,
    wait_until,
    write_job,
)

pytestmark = [pytest.mark.services, pytest.mark.docker, pytest.mark.slow]
TASKS = ["humanfmt__humanfmt-1", "dslib__dslib-1"]


def test_tiny_model_job_runs_through_redis_workers_into_postgresql(pg_db, tmp_path):
    require(*docker_status())
    env = service_env(fresh_redis_url(), pg_db.url)
    job_file = write_job(
        tmp_path / "job.yaml",
        name="tiny-2x2x2",
        backend="hf",
        model={"name": "tiny", "device": "cpu"},
        methods=["dense", "nexus"],
        scopes=["prefill_only"],
        protocols=["true_eviction", "full_context"],
        tasks={"suite": "mini", "ids": TASKS},
        limits={"max_steps": 2, "soft_step_limit": 2},
        sampling={"max_new_tokens": 24},
    )
    gpu = Worker(env, "gpu", tmp_path / "gpu.log")
    grade = Worker(env, "grade,default", tmp_path / "grade.log", concurrency=2)
    try:
        submitted = cli("submit", "--file", str(job_file), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().splitlines()[-1]
        wait_until(lambda: job_done(pg_db, job_id), 600, f"job {job_id}", lambda: gpu.tail() + grade.tail())
    finally:
        gpu.stop()
        grade.stop()

    with pg_db.session() as s:
        rows = db_store.episodes_for_job(s, job_id)
        # dense and nexus in both protocols (Qwen3's template re-renders a history without its <think> blocks, so
        # dense under full context is its own computation): 2 x (2 + 2) episodes
        assert len(rows) == 8 and all(r.attempt == 1 for r in rows)
        assert {(r.method, r.protocol) for r in rows} == {
            ("dense", "true_eviction"),
            ("dense", "full_context"),
            ("nexus", "true_eviction"),
            ("nexus", "full_context"),
        }
        # every episode was graded (the tiny model's patches are empty or fail) and its turns were stored
        assert all(r.status in {"resolved", "unresolved", "empty_patch", "patch_failed"} for r in rows), [
            (r.status, r.error) for r in rows
        ]
        for r in rows:
            n_turns = s.execute(select(func.count(Turn.id)).where(Turn.episode_id == r.id)).scalar_one()
            assert n_turns == r.n_turns == 2
            assert r.worker and r.n_claims == 1 and r.celery_task_id
        nexus_turn = s.execute(
            select(Turn).join(Episode).where(Episode.job_id == job_id, Episode.method == "nexus").limit(1)
        ).scalar_one()
        assert nexus_turn.tokens_generated > 0 and nexus_turn.physical_after is not None

    compared = cli("compare", job_id, "--format", "json", env=env)
    assert compared.returncode == 0, compared.stderr
    table = json.loads(compared.stdout)
    assert table["methods"] == ["dense", "nexus"]
    cells = {(row["scope"], row["protocol"]): row["cells"] for row in table["rows"]}
    assert set(cells) == {("prefill_only", "true_eviction"), ("prefill_only", "full_context")}
    for cell in cells.values():
        assert cell["dense"]["n"] == 2 and cell["nexus"]["n"] == 2
        assert cell["nexus"]["n_pairs"] == 2  # paired against dense on the same tasks
    assert cells[("prefill_only", "full_context")]["dense"]["reused_dense"] is False  # its own protocol's dense
