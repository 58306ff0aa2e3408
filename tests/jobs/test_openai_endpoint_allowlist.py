"""A ``backend: openai`` job names where the worker sends requests and which variable it sends as the key; the
operator's allow-lists decide (issue 33, item 1): ``submit`` / ``run`` / ``episode`` (``--show`` too) refuse
with exit 2 before anything is stored, and a worker refuses a stored episode again before its first request.

Real states: job files in tmp folders, the CLI in-process (typer's runner), a SQLite results database, and a
real HTTP listener on 127.0.0.x (``tests.agent_runner.test_openai_allowlist.Listener``) that records every request.
"""

from __future__ import annotations

import pytest
import yaml

from agent_runner.backend_settings import AllowedEndpoints
from db import store as db_store
from db.models import Job
from jobs.settings import ServiceSettings
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.agent_runner.conftest import RecordingEnvironment
from tests.agent_runner.test_openai_allowlist import Listener, ok_reply
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from workers.execution import EpisodeHooks, WorkerContext, execute_episode
from workers.faults.recovery import retry_infra_failure


def invoke(*args: str, env: dict[str, str] | None = None):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    return CliRunner().invoke(app, list(args), env=env)


def openai_job(tmp_path, **openai) -> str:
    """A job file: one dense openai episode of a mini task, with these ``openai`` settings."""
    job = {
        "backend": "openai",
        "methods": ["dense"],
        "tasks": {"suite": "mini", "ids": ["humanfmt__humanfmt-1"]},
        "limits": {"max_steps": 2, "soft_step_limit": 2},
        "openai": {"max_retries": 0, "timeout_s": 5, **openai},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No allow-list of the shell leaks in; the results database is a tmp file."""
    for var in ("NEXUS_EVAL_OPENAI_HOSTS", "NEXUS_EVAL_OPENAI_KEY_ENVS", "NEXUS_EVAL_BROKER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NEXUS_EVAL_DB", f"sqlite:///{tmp_path}/nexus-eval.db")


# --- where a job is accepted ----------------------------------------------------------------------------------
@pytest.mark.parametrize("verb", ["submit", "run"])
def test_show_refuses_a_job_that_sends_the_database_url_as_its_key(verb, tmp_path, listener, clean_env):
    job = openai_job(tmp_path, base_url=listener.base_url, api_key_env="NEXUS_EVAL_DB")
    result = invoke(verb, "--show", "-f", job)
    assert result.exit_code == 2, result.output
    assert "openai.api_key_env" in result.output and "'NEXUS_EVAL_DB'" in result.output
    assert "NEXUS_EVAL_OPENAI_KEY_ENVS" in result.output
    assert "nothing was" in result.output
    assert listener.requests == []


def test_submit_refuses_before_anything_is_stored(tmp_path, listener, clean_env):
    db = tmp_path / "results.db"
    job = openai_job(tmp_path, base_url=listener.base_url, api_key_env="NEXUS_EVAL_DB")
    result = invoke("submit", "-f", job, "--db", str(db))
    assert result.exit_code == 2 and "NEXUS_EVAL_OPENAI_KEY_ENVS" in result.output, result.output
    if db.exists():  # nothing stored (a file made by a check stays empty of jobs)
        from db import connect, sqlite_url

        with connect(sqlite_url(db)).session() as s:
            assert s.query(Job).count() == 0
    assert listener.requests == []


def test_a_host_off_the_list_is_refused_unless_the_operator_adds_it(tmp_path, clean_env):
    job = openai_job(tmp_path, base_url="http://vllm.internal:8000/v1")
    refused = invoke("submit", "--show", "-f", job)
    assert refused.exit_code == 2, refused.output
    assert "openai.base_url" in refused.output and "'vllm.internal'" in refused.output
    assert "NEXUS_EVAL_OPENAI_HOSTS" in refused.output
    allowed = invoke("submit", "--show", "-f", job, env={"NEXUS_EVAL_OPENAI_HOSTS": "127.0.0.1,vllm.internal"})
    assert allowed.exit_code == 0, allowed.output
    assert yaml.safe_load(allowed.stdout)["openai"]["base_url"] == "http://vllm.internal:8000/v1"


def test_a_key_variable_the_operator_adds_is_accepted(tmp_path, clean_env):
    job = openai_job(tmp_path, api_key_env="VLLM_TOKEN")
    assert invoke("submit", "--show", "-f", job).exit_code == 2
    shown = invoke("submit", "--show", "-f", job, env={"NEXUS_EVAL_OPENAI_KEY_ENVS": "OPENAI_API_KEY,VLLM_TOKEN"})
    assert shown.exit_code == 0, shown.output


def test_a_base_url_with_a_query_is_refused_at_submit(tmp_path, clean_env):
    result = invoke("submit", "--show", "-f", openai_job(tmp_path, base_url="http://127.0.0.1:8000/admin?x="))
    assert result.exit_code == 2, result.output
    assert "openai.base_url" in result.output and "query string" in result.output


def test_the_episode_verb_checks_its_base_url(tmp_path, listener, clean_env):
    # '127.1' reaches the listener on 127.0.0.1 but is not a name on the list: refused before any request
    task, base_url = "humanfmt__humanfmt-1", listener.base_url.replace("127.0.0.1", "127.1")
    result = invoke("episode", "--task", task, "--backend", "openai", "--method", "dense", "--base-url", base_url)
    assert result.exit_code == 2, result.output
    assert "openai.base_url" in result.output and "NEXUS_EVAL_OPENAI_HOSTS" in result.output
    assert listener.requests == []


# --- the worker: a stored episode is checked again ----------------------------------------------------------------
def _stored_openai_episode(db, **openai) -> str:
    """An openai episode stored as a job from before the check (or another host) would be: no CLI check ran."""
    spec = JobSpec.model_validate(
        {
            "backend": "openai",
            "methods": ["dense"],
            "tasks": {"suite": "mini", "ids": ["humanfmt__humanfmt-1"]},
            "limits": {"max_steps": 2, "soft_step_limit": 2},
            "openai": {"max_retries": 0, "timeout_s": 5, **openai},
        }
    )
    _, (episode_id,) = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    return episode_id


def _hooks() -> EpisodeHooks:
    return EpisodeHooks(open_environment=lambda task, **kw: RecordingEnvironment())


def test_the_worker_refuses_a_stored_episode_before_any_request(sqlite_db, listener, monkeypatch):
    monkeypatch.setenv("NEXUS_EVAL_DB", "postgresql+psycopg://nexus:s3cret@127.0.0.1/nexus")
    listener.queue = [(200, ok_reply(), {}, None)] * 3
    episode_id = _stored_openai_episode(sqlite_db, base_url=listener.base_url, api_key_env="NEXUS_EVAL_DB")
    outcome = execute_episode(sqlite_db, episode_id, hooks=_hooks())
    with sqlite_db.session() as s:
        row = db_store.get_episode(s, episode_id)
        status, error = row.status, row.error or ""
    assert outcome.written and status == "infra_failure"
    assert "openai.api_key_env='NEXUS_EVAL_DB'" in error and "NEXUS_EVAL_OPENAI_KEY_ENVS" in error
    assert "s3cret" not in error
    assert listener.requests == []
    # the refusal is the operator's setting, not a fault: no automatic new attempt that would only repeat it
    sent: list[str] = []
    assert retry_infra_failure(sqlite_db, episode_id, retries=2, send_run=sent.append) is None and sent == []


def test_the_worker_takes_a_custom_host_its_settings_allow(sqlite_db, listener, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-ok")
    listener.queue = [(200, ok_reply(), {}, None)] * 3
    custom = listener.base_url.replace("127.0.0.1", "127.1")  # the listener, by a name not on the default list
    refused = _stored_openai_episode(sqlite_db, base_url=custom, api_key_env="VLLM_API_KEY")
    assert execute_episode(sqlite_db, refused, hooks=_hooks()).status == "infra_failure"
    assert listener.requests == []

    settings = ServiceSettings.from_env({"NEXUS_EVAL_OPENAI_HOSTS": "127.1"})
    allowed = _stored_openai_episode(sqlite_db, base_url=custom + "/", api_key_env="VLLM_API_KEY")
    outcome = execute_episode(sqlite_db, allowed, worker=WorkerContext(allowed=settings.openai_allowed), hooks=_hooks())
    assert outcome.status == "submitted", outcome
    assert listener.requests and listener.requests[0]["headers"]["Authorization"] == "Bearer sk-ok"


# --- the settings ---------------------------------------------------------------------------------------------------
def test_the_allow_lists_are_service_settings_read_from_the_environment():
    default = ServiceSettings.from_env({})
    assert default.openai_key_envs == ("OPENAI_API_KEY", "*_API_KEY")
    assert default.openai_hosts == ("127.0.0.1", "localhost", "::1")
    given = ServiceSettings.from_env(
        {"NEXUS_EVAL_OPENAI_HOSTS": " vllm.internal, *.Cluster.local ,", "NEXUS_EVAL_OPENAI_KEY_ENVS": "VLLM_KEY"}
    )
    assert given.openai_hosts == ("vllm.internal", "*.cluster.local")
    assert given.openai_allowed == AllowedEndpoints(("VLLM_KEY",), ("vllm.internal", "*.cluster.local"))
    with pytest.raises(ValueError, match=r"openai_hosts \(\$NEXUS_EVAL_OPENAI_HOSTS\)"):
        ServiceSettings.from_env({"NEXUS_EVAL_OPENAI_HOSTS": "http://vllm.internal/v1"})
    with pytest.raises(ValueError, match=r"openai_key_envs \(\$NEXUS_EVAL_OPENAI_KEY_ENVS\)"):
        ServiceSettings.from_env({"NEXUS_EVAL_OPENAI_KEY_ENVS": "A-B"})
