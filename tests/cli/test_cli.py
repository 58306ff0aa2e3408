"""The service verbs on a local SQLite database and the embedded broker (fast: no worker, no container).

Episodes are driven through the real claim/record/finish/grade API where a run would have written them;
the end-to-end runs through workers are in test_worker.py / test_faults.py / test_interactive.py."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from db import connect, job_rows, sqlite_url
from db import store as db_store
from db.models import Episode, Job
from jobs.queue import make_app
from jobs.settings import ServiceSettings
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.support.worker_fixtures import cli, oracle_job, write_job
from workers.execution import ExecutionOutcome, execute_episode


def invoke(*args: str):
    """Run a verb in this process (for verbs that never send a message); returns click's Result."""
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    return CliRunner().invoke(app, list(args))


def read_cli(*args: str, db) -> str:
    """A read-only verb against ``db``; returns its stdout."""
    result = invoke(*args, "--db", db.url)
    assert result.exit_code == 0, result.output
    return result.stdout


PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.fixture
def local(tmp_path):
    url = sqlite_url(tmp_path / "nexus-eval.db")
    env = {**os.environ, "NEXUS_EVAL_DB": url}
    env.pop("NEXUS_EVAL_BROKER", None)
    return connect(url), env


def _finished_job(db, statuses=("resolved", "unresolved")):
    """A job of two oracle episodes finished through the claim API with the given final statuses."""
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1", "dslib__dslib-1"], ["nexus"], ["true_eviction"]))
    job_id, ids = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    for episode_id, status in zip(ids, statuses, strict=True):
        with db.session() as s:
            claim = db_store.claim_episode(s, episode_id)
        with db.session() as s:
            db_store.record_turn(
                s,
                claim,
                0,
                tokens_generated=7,
                completion="<think>x</think>",
                action={"name": "finish", "arguments": {}},
                physical_after={"min": 1, "mean": 2, "max": 3},
                observation="done",
            )
        with db.session() as s:
            db_store.finish_episode(s, claim, "submitted", patch="" if status == "empty_patch" else PATCH)
        with db.session() as s:
            db_store.record_grade(
                s, episode_id, "unresolved" if status == "empty_patch" else status, test_log="log", grader="test"
            )
    return job_id, ids


def test_settings_refuse_a_visibility_timeout_below_the_hard_limit():
    with pytest.raises(ValueError, match="visibility_timeout_s"):
        ServiceSettings(soft_time_limit_s=10, hard_time_limit_s=20, visibility_timeout_s=15)
    with pytest.raises(ValueError, match="hard_time_limit_s"):
        ServiceSettings(soft_time_limit_s=30, hard_time_limit_s=20)


def test_app_has_the_long_task_settings_and_routes(tmp_path):
    app = make_app(ServiceSettings(db_url=sqlite_url(tmp_path / "x.db"), soft_time_limit_s=100, hard_time_limit_s=200))
    conf = app.conf
    assert (conf.task_acks_late, conf.task_reject_on_worker_lost, conf.worker_prefetch_multiplier) == (True, True, 1)
    assert (conf.task_soft_time_limit, conf.task_time_limit) == (100, 200)
    assert conf.task_routes["nexus.episode"] == {"queue": "gpu"}
    assert conf.task_routes["nexus.grade"] == {"queue": "grade"}
    assert app.conf.broker_url.startswith("sqla+sqlite:///") and str(tmp_path) in app.conf.broker_url
    redis_app = make_app(ServiceSettings(broker_url="redis://127.0.0.1:6379/3", hard_time_limit_s=20_000))
    assert redis_app.conf.broker_transport_options["visibility_timeout"] == 20_000 + 3600


def test_malformed_job_file_names_file_and_field_and_stores_nothing(local, tmp_path):
    db, env = local
    bad = write_job(tmp_path / "job.yaml", methods=["dense"], density=1.5, backend="oracle", tasks={"suite": "mini"})
    done = invoke("submit", "--file", str(bad), "--db", db.url)
    assert done.exit_code == 2
    assert str(bad) in done.output and "density" in done.output and "nothing was submitted" in done.output
    unknown_task = write_job(tmp_path / "t.yaml", **oracle_job(["no_such_task-1"], ["dense"], ["true_eviction"]))
    done = invoke("submit", "--file", str(unknown_task), "--db", db.url)
    assert done.exit_code == 2 and "no_such_task-1" in done.output
    with db.session() as s:
        assert (s.query(Job).count(), s.query(Episode).count()) == (0, 0)
    assert not (tmp_path / "celery-broker.db").exists()  # no message was ever sent


def test_bad_method_settings_are_refused_before_anything_is_stored(local, tmp_path):
    """A value only the policy can judge (it needs torch) is checked by submit/run too, naming the field."""
    db, env = local
    job = oracle_job(["humanfmt__humanfmt-1"], ["nexus", "h2o"], ["true_eviction"])
    bad = write_job(tmp_path / "job.yaml", **job, preset="reference", method_params={"nexus": {"lam": -1}})
    done = invoke("submit", "--file", str(bad), "--db", db.url)
    assert done.exit_code == 2, done.output
    assert f"{bad}: field 'method_params.nexus.lam': nexus: lam must be a finite number >= 0" in done.output
    assert "nothing was submitted" in done.output
    done = invoke("run", "--backend", "oracle", "--methods", "dense,h2o", "--preset", "best", "--db", db.url)
    assert done.exit_code == 2 and "unknown preset 'best'" in done.output
    with db.session() as s:
        assert (s.query(Job).count(), s.query(Episode).count()) == (0, 0)


def test_a_submission_plans_its_fan_out_once(local, tmp_path, monkeypatch):
    """``load_job`` loads the tasks and plans the episodes (the selection checked before anything is stored);
    ``submit`` stores and sends that plan, computing nothing again."""
    import jobs.submit
    from nexus_eval.commands._job_flags import load_job

    db, _ = local
    plans = []
    real = jobs.submit.plan_episodes
    monkeypatch.setattr(jobs.submit, "plan_episodes", lambda spec, tasks: plans.append(spec) or real(spec, tasks))
    job = oracle_job(["humanfmt__humanfmt-1", "dslib__dslib-1"], ["dense", "nexus"], ["true_eviction"])
    plan = load_job(write_job(tmp_path / "job.yaml", **job), {"seeds": [0, 1]}, what="nothing was submitted")
    assert len(plan.keys) == 8 and {k.task_id for k in plan.keys} == {"humanfmt__humanfmt-1", "dslib__dslib-1"}
    app = make_app(ServiceSettings(db_url=db.url))
    job_id, sent = jobs.submit.submit(db, plan, app=app)
    assert len(plans) == 1 and sent == 8
    with db.session() as s:
        stored = [(r.task_id, r.method, r.config) for r in db_store.episodes_for_job(s, job_id)]
    assert sorted(stored, key=str) == sorted(((k.task_id, k.method, k.config) for k in plan.keys), key=str)


def test_compare_inspect_export_and_status_read_the_database(local):
    db, env = local
    job_id, ids = _finished_job(db)
    table = json.loads(read_cli("compare", job_id, "--format", "json", db=db))
    cell = table["rows"][0]["cells"]["nexus"]
    assert (cell["n"], cell["resolved"]) == (2, 1)
    assert "| nexus" in read_cli("compare", job_id, "--format", "markdown", db=db)
    assert invoke("compare", job_id, "--format", "yaml", "--db", db.url).exit_code == 2

    shown = json.loads(read_cli("inspect", ids[0], "--json", db=db))
    assert shown["episode"]["id"] == ids[0] and shown["turns"][0]["physical_after"] == {"min": 1, "mean": 2, "max": 3}
    assert "turns" in read_cli("inspect", ids[0][:6], db=db)

    lines = [json.loads(x) for x in read_cli("export", job_id, db=db).splitlines()]
    assert {x["instance_id"] for x in lines} == {"humanfmt__humanfmt-1", "dslib__dslib-1"}
    assert all(
        set(x) == {"instance_id", "model_name_or_path", "model_patch"} and x["model_patch"] == PATCH for x in lines
    )
    assert job_id in read_cli("status", db=db)
    assert "nexus" in read_cli("status", job_id, db=db)


def test_regrade_rederives_verdicts_without_a_container(local):
    db, env = local
    job_id, ids = _finished_job(db, statuses=("empty_patch", "empty_patch"))  # stored wrongly as unresolved
    assert "regraded 2 episodes" in read_cli("regrade", job_id, db=db)
    with db.session() as s:
        assert {r.status for r in db_store.episodes_for_job(s, job_id)} == {"empty_patch"}


def test_rerun_failed_adds_new_attempt_rows_for_broken_runs_only_and_keeps_the_old_ones(local):
    """`--failed` reruns the runs that broke; a verdict is never rerun by it (that would make Pass@1 a best of n).
    `--status unresolved` still can, and says its attempts are resamples."""
    db, env = local
    job_id, ids = _finished_job(db, statuses=("infra_failure", "unresolved"))
    assert cli("rerun", job_id, env=env).returncode == 2  # neither --status nor --failed
    done = cli("rerun", job_id, "--failed", env=env)
    assert done.returncode == 0, done.stderr
    assert "1 new attempts enqueued (infra_failure, timeout)" in done.stdout and "resample" not in done.stdout
    with db.session() as s:
        rows = db_store.episodes_for_job(s, job_id)
        assert sorted((r.status, r.attempt) for r in rows) == [("infra_failure", 1), ("queued", 2), ("unresolved", 1)]
        queued = [r for r in rows if r.status == "queued"][0]
        assert queued.celery_task_id  # it was sent to the (embedded) broker
    again = cli("rerun", job_id, "--status", "unresolved", env=env)
    assert again.returncode == 0, again.stderr
    assert "1 new attempts" in again.stdout and "resamples" in again.stdout and "never as Pass@1" in again.stdout


def test_cancelled_job_episodes_do_nothing_when_their_message_arrives(local):
    db, env = local
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["dense", "nexus"], ["true_eviction"]))
    job_id, ids = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    done = cli("cancel", job_id, env=env)
    assert done.returncode == 0, done.stderr
    outcome = execute_episode(db, ids[0])
    assert outcome == ExecutionOutcome(
        ids[0], ran=False, reason="not claimed (episode is cancelled)", timings=outcome.timings
    )
    with db.session() as s:
        assert {r.status for r in db_store.episodes_for_job(s, job_id)} == {"cancelled"}
        assert job_rows.get_job(s, job_id).status == "cancelled"


def test_worker_refuses_unknown_queues_and_gpu_concurrency(local):
    assert "unknown queue" in invoke("worker", "--queues", "gpu,cpu").output
    assert "one process per GPU" in invoke("worker", "--queues", "gpu", "-c", "2").output


def test_worker_episodes_per_gpu_runs_one_threaded_process(local, monkeypatch):
    """The flag reaches the worker's one settings object (what each episode task hands execute_episode), not
    the process environment; the environment's value is the default when the flag is not given."""
    import nexus_eval.commands.service as service_cmd
    from jobs.settings import ServiceSettings

    bad = invoke("worker", "--queues", "gpu", "--episodes-per-gpu", "0")
    assert bad.exit_code == 2 and "episodes-per-gpu" in bad.output
    assert "gpu queue" in invoke("worker", "--queues", "grade", "--episodes-per-gpu", "2").output
    seen = {}

    class App:
        def __init__(self, **worker):
            self.conf = type("Conf", (), {"nexus_settings": ServiceSettings.from_env(**worker)})()

        def worker_main(self, argv):
            seen["argv"], seen["settings"] = argv, self.conf.nexus_settings

    monkeypatch.setattr(service_cmd, "celery_app", lambda db, **worker: App(**worker))
    monkeypatch.delenv("NEXUS_EVAL_EPISODES_PER_GPU", raising=False)
    done = invoke("worker", "--queues", "gpu", "--episodes-per-gpu", "4", "--device", "cuda:1")
    assert done.exit_code == 0, done.output
    argv = seen["argv"]
    assert argv[argv.index("--pool") + 1] == "threads" and argv[argv.index("--concurrency") + 1] == "4"
    assert seen["settings"].episodes_per_gpu == 4 and seen["settings"].device == "cuda:1"
    assert "NEXUS_EVAL_EPISODES_PER_GPU" not in os.environ  # no side door through the environment
    monkeypatch.setenv("NEXUS_EVAL_EPISODES_PER_GPU", "3")  # a deployment's default (compose.yaml)
    assert invoke("worker", "--queues", "gpu").exit_code == 0 and seen["settings"].episodes_per_gpu == 3
    monkeypatch.setenv("NEXUS_EVAL_EPISODES_PER_GPU", "many")
    with pytest.raises(ValueError, match="whole number"):
        ServiceSettings.from_env()


@pytest.mark.docker
@pytest.mark.slow
def test_embedded_run_goes_through_the_tasks_and_prints_the_compare_table(tmp_path):
    from tests.conftest import docker_status, require

    require(*docker_status())
    env = {k: v for k, v in os.environ.items() if k != "NEXUS_EVAL_BROKER"}
    db_path = tmp_path / "runs" / "nexus-eval.db"
    flags = ["--backend", "oracle", "--methods", "dense,nexus", "--protocols", "true_eviction"]
    flags += ["--tasks", "humanfmt__humanfmt-1", "--db", str(db_path)]
    done = cli("run", *flags, "--format", "json", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    table = json.loads(done.stdout)
    shown = cli("run", *flags, "--show", env=env)  # what --show prints is what was stored
    assert shown.returncode == 0, shown.stderr
    with connect(sqlite_url(db_path)).session() as s:
        stored = JobSpec.model_validate(job_rows.get_job(s, table["job_ids"][0]).config)
    assert stored == JobSpec.model_validate(yaml.safe_load(shown.stdout))
    assert table["rows"][0]["cells"]["nexus"]["resolved"] == 1
    assert (tmp_path / "runs" / "celery-broker.db").exists()  # it went through the embedded broker
    db = connect(sqlite_url(db_path))
    with db.session() as s:
        rows = db_store.latest_attempts(s, table["job_ids"])
        assert len(rows) == 2 and all(r.celery_task_id and r.worker for r in rows)
