"""One episode path, one seed, one set of defaults (issue 19).

- The episode's one seed reaches the sampler through every entry point: two seeds of the same dense episode
  sample apart, the same seed twice gives the same tokens, and the stored config records the seed that
  sampled it. Through the service path (``execute_episode``) and through the CLI ``episode`` verb, both on
  the tiny model at temperature 1 in real containers. (Before: every service episode sampled with seed 0.)
- ``submit``, ``run`` and ``episode`` take their defaults from the job spec alone; flags given on top of a
  file override it instead of being ignored.
- A job's task source is loaded once per submit and once per worker process (a counting loader).
"""

from __future__ import annotations

import json

import pytest
import yaml

from agent_runner.config import EpisodeSpec
from db import connect, sqlite_url
from db import store as db_store
from env.tasks import loading as task_loading
from env.tasks.task_cache import TaskCache
from jobs.job_file import QUICK_JOB_FILE
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.conftest import docker_status, require
from workers.execution import WorkerContext, execute_episode
from workers.grade_stored import grade_stored_episode

TASK = "humanfmt__humanfmt-1"


def invoke(*args: str, env: dict[str, str] | None = None):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    return CliRunner().invoke(app, list(args), env=env)


def _shown(*args: str) -> dict:
    """The job a verb would store (``--show``), parsed."""
    result = invoke(*args, "--show")
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def _stored(spec: JobSpec) -> dict:
    return yaml.safe_load(spec.to_yaml())


# --- one set of defaults ------------------------------------------------------------------------------------
def test_submit_run_and_episode_take_the_job_specs_defaults(tmp_path):
    defaults = _stored(JobSpec())
    submitted, ran = _shown("submit"), _shown("run")
    assert submitted == defaults  # no flags: exactly the job spec's defaults, nothing of the verb's own
    assert ran == _stored(JobSpec.from_yaml(QUICK_JOB_FILE)) == _shown("submit", "-f", str(QUICK_JOB_FILE))
    for key in ("scopes", "protocols", "density", "preset", "seeds"):  # the quick job keeps these defaults
        assert submitted[key] == ran[key] == defaults[key], key
    assert submitted["limits"] == defaults["limits"] and ran["limits"] == {
        **defaults["limits"],
        **yaml.safe_load(QUICK_JOB_FILE.read_text())["limits"],
    }
    helped = invoke("run", "--help", env={"COLUMNS": "200"}).output  # `run --help` shows the quick job itself
    for line in QUICK_JOB_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert line in helped, line
    # the episode verb runs one cell of the same defaults: the first method, scope, protocol and seed
    from nexus_eval.commands.episode import _one_episode

    job = JobSpec()
    assert _one_episode(None, {}, TASK) == job.episode_config(TASK, job.methods[0], *job.cells(job.methods[0])[0], 0)


def test_flags_given_with_a_file_override_it_and_are_never_dropped(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "methods: [dense, snapkv]\ndensity: 0.3\nlimits: {max_steps: 9, soft_step_limit: 5}\n"
        "tasks: {suite: mini, ids: [argkit__argkit-1]}\n"
    )
    shown = _shown("submit", "-f", str(job_file), "--density", "0.1", "--max-steps", "4", "--seeds", "0,1")
    assert shown["density"] == 0.1 and shown["seeds"] == [0, 1]
    assert shown["limits"]["max_steps"] == 4 and shown["limits"]["soft_step_limit"] == 5  # the rest of limits kept
    assert shown["methods"] == ["dense", "snapkv"] and shown["tasks"]["ids"] == ["argkit__argkit-1"]
    replaced = _shown("submit", "-f", str(job_file), "--suite", "mini", "--tasks", "dslib__*")
    assert replaced["tasks"] == {"suite": "mini", "split": "test", "ids": ["dslib__*"]}
    bad = invoke("submit", "-f", str(job_file), "--density", "3")
    assert bad.exit_code == 2 and "density must be in (0, 1]" in bad.output and "density=3.0" in bad.output
    assert "nothing was submitted" in bad.output


# --- the seed -----------------------------------------------------------------------------------------------
def _dense_job(seeds: list[int]) -> JobSpec:
    return JobSpec.from_dict(
        {
            "model": {"name": "tiny", "device": "cpu"},
            "methods": ["dense"],
            "seeds": seeds,
            "tasks": {"suite": "mini", "ids": [TASK]},
            "limits": {"max_steps": 1, "soft_step_limit": 1},
            "sampling": {"temperature": 1.0, "max_new_tokens": 24},
            "grade": False,
        }
    )


@pytest.mark.docker
@pytest.mark.slow
def test_each_seed_samples_its_own_episode_through_the_service_path(tmp_path):
    require(*docker_status())
    db = connect(sqlite_url(tmp_path / "nexus-eval.db"))
    tasks = TaskCache()
    runs = {}
    for name, spec in (("first", _dense_job([0, 1])), ("again", _dense_job([0]))):
        _, ids = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
        for episode_id in ids:
            assert execute_episode(db, episode_id, worker=WorkerContext(tasks=tasks)).written
            with db.session() as s:
                row = db_store.get_episode(s, episode_id)
                runs[(name, row.seed)] = (row.turns[0].tokens["generated"], row.turns[0].completion, dict(row.config))
    (seed0, text0, config0), (seed1, text1, config1) = runs[("first", 0)], runs[("first", 1)]
    assert seed0 != seed1 and text0 != text1  # before: both sampled with seed 0, token for token the same
    assert runs[("again", 0)][0] == seed0  # the same seed reproduces the same tokens
    for seed, config in ((0, config0), (1, config1)):  # the stored config names the seed that sampled it
        assert config["seed"] == seed and "seed" not in config["agent"]
        assert "seed" not in config["eviction"]  # stored once: the eviction's seed is the episode's (issue 45)
        assert EpisodeSpec.model_validate(config).eviction.seed == seed


@pytest.mark.docker
@pytest.mark.slow
def test_each_seed_samples_its_own_episode_through_the_cli_episode_verb():
    require(*docker_status())
    args = ["episode", "--task", TASK, "--method", "dense", "--max-steps", "1", "--max-new-tokens", "24"]
    args += ["--device", "cpu", "--no-grade", "--json"]
    tokens = {}
    for run, seed in (("a", 0), ("b", 1), ("c", 0)):
        result = invoke(*args, "--seed", str(seed))
        assert result.exit_code == 0, result.output
        episode = json.loads(result.stdout.strip().splitlines()[-1])
        assert episode["config"]["episode"]["seed"] == seed
        tokens[run] = episode["turns"][0]["completion"]["tokens"]["generated"]
    assert tokens["a"] != tokens["b"] and tokens["a"] == tokens["c"]


# --- each thing done once -----------------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.slow
def test_the_task_source_is_loaded_once_per_submit_and_once_per_worker_process(tmp_path, monkeypatch):
    """A counting loader around ``env.tasks.loading.load_source``: the CLI's submit (validation, preflight, fan-out and
    storing) loads the source once; a worker process running and grading every episode loads it once more."""
    require(*docker_status())
    import jobs.queue

    loads = []
    real = task_loading.load_source

    def counting(**source):
        loads.append(source)
        return real(**source)

    monkeypatch.setattr(task_loading, "load_source", counting)
    monkeypatch.setattr(jobs.queue, "_APP", [])  # this test's own embedded app, whatever earlier tests built
    url = sqlite_url(tmp_path / "nexus-eval.db")
    environ = {"NEXUS_EVAL_DB": url, "NEXUS_EVAL_BROKER": ""}
    args = ["submit", "--backend", "oracle", "--methods", "dense,nexus", "--tasks", f"{TASK},dslib__dslib-1"]
    submitted = invoke(*args, "--db", url, env=environ)
    assert submitted.exit_code == 0, submitted.output
    assert len(loads) == 1, loads
    job_id = submitted.stdout.strip().splitlines()[-1]
    db = connect(url)
    with db.session() as s:
        ids = [r.id for r in db_store.latest_attempts(s, [job_id])]
    assert len(ids) == 4
    worker_tasks = TaskCache()  # one per worker process (workers.celery_tasks._TASKS)
    for episode_id in ids:
        assert execute_episode(db, episode_id, worker=WorkerContext(tasks=worker_tasks)).needs_grade
        assert grade_stored_episode(db, episode_id, worker=WorkerContext(tasks=worker_tasks)) == "resolved"
    assert len(loads) == 2, loads


def test_a_nested_flag_without_a_file_keeps_the_rest_of_the_default():
    shown = _shown("submit", "--tasks", "dslib__*", "--max-steps", "3")
    assert shown["tasks"] == {"suite": "mini", "split": "test", "ids": ["dslib__*"]}
    assert shown["limits"] == {**_stored(JobSpec())["limits"], "max_steps": 3}
