"""The runner's record of what ran (``EpisodeResult.config``) is stored with the episode (``result["runner"]``), so a
worker host's own settings, such as its device override, are on the row. The tiny model with a sandbox test double
(no Docker) on a SQLite file."""

from __future__ import annotations

from agent_runner.config import EpisodeSpec
from db import store as db_store
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.agent_runner.conftest import RecordingEnvironment
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from tests.support.worker_fixtures import oracle_job
from workers.execution import EpisodeHooks, WorkerContext, execute_episode
from workers.stored_records import runner_spec

HOOKS = EpisodeHooks(open_environment=lambda task, **kw: RecordingEnvironment())
TASK = "humanfmt__humanfmt-1"


def _run(db, job: dict, worker: WorkerContext):
    spec = JobSpec.from_dict(job)
    _, (episode_id,) = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    outcome = execute_episode(db, episode_id, worker=worker, hooks=HOOKS)
    assert outcome.written, outcome.reason
    with db.session() as s:
        row = db_store.get_episode(s, episode_id)
        return dict(row.config), dict(row.result), row.error


def test_a_workers_device_override_is_stored_with_the_episode(sqlite_db):
    job = {
        "backend": "hf",
        "model": {"name": "tiny", "device": "auto"},
        "methods": ["dense"],
        "tasks": {"suite": "mini", "ids": [TASK]},
        "limits": {"max_steps": 1, "soft_step_limit": 1},
        "sampling": {"max_new_tokens": 8},
    }
    config, result, error = _run(sqlite_db, job, WorkerContext(device="cpu"))
    assert config["model"]["device"] == "auto"  # the job's, as submitted
    runner = result["runner"]
    assert runner is not None, error
    ran = runner_spec(config, result)
    assert ran["model"]["device"] == "cpu"  # the host's, as it ran
    assert runner["device"] == "cpu"  # where the weights were
    assert runner["model"] == "HFBackend" and ran["grade"] is False
    assert ran["task_id"] == TASK and ran["seed"] == config["seed"]
    # stored as what the worker changed, not a second copy of the config
    assert runner["episode_changes"]["set"] == {"model.device": "cpu", "grade": False}
    assert EpisodeSpec.model_validate(ran).model_dump(mode="json") == ran


def test_a_backend_without_weights_records_no_device(sqlite_db):
    _, result, _ = _run(sqlite_db, oracle_job([TASK], ["dense"], ["true_eviction"]), WorkerContext())
    assert result["runner"]["model"] == "OracleModel" and result["runner"]["device"] is None
