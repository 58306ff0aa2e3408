"""A job whose backend cannot run one of its methods is refused at submit, naming ``methods`` and what would run
(``expert`` and ``openai`` run dense only), and never reaches a worker to fail there three times as
``infra_failure``. The rule is ``agent_runner.config.check_backend_method``, which the worker's guard
(``agent_runner.loaded_models.backend_for``) applies too; a stored job and a replay's extension of one still read."""

from __future__ import annotations

import pytest

from agent_runner.config import DENSE_ONLY_BACKENDS, check_backend_method
from agent_runner.loaded_models import backend_for
from db.models import Episode, Job
from jobs.job_file import JobSpecError
from jobs.spec import JobSpec
from jobs.submit import load_job_tasks, plan_job
from jobs.variants import job_spec_for
from tests.cli.test_cli import invoke, local  # noqa: F401  (fixtures)
from tests.support.worker_fixtures import write_job

TASK = "humanfmt__humanfmt-1"


def job(backend: str, methods: list[str], **extra) -> JobSpec:
    data = {"backend": backend, "methods": methods, "tasks": {"suite": "mini", "ids": [TASK]}, **extra}
    return JobSpec.from_dict(data)


def refusal(spec: JobSpec, source: str = "job.yaml") -> JobSpecError:
    with pytest.raises(JobSpecError) as info:
        plan_job(spec, load_job_tasks(spec), source=source)
    return info.value


def test_the_dense_only_backends_are_expert_and_openai():
    assert sorted(DENSE_ONLY_BACKENDS) == ["expert", "openai"]
    check_backend_method("expert", "dense")
    check_backend_method("oracle", "snapkv")  # the oracle ignores the method: the pipeline check runs any
    check_backend_method("hf", "snapkv")


@pytest.mark.parametrize("backend", ["expert", "openai"])
def test_a_method_the_backend_cannot_run_is_refused_naming_the_field_and_what_would_run(backend):
    extra = {"openai": {"model": "m"}} if backend == "openai" else {}
    error = refusal(job(backend, ["dense", "snapkv", "h2o"], **extra))
    assert [field for field, _ in error.errors] == ["methods", "methods"]
    message = str(error)
    assert message.startswith("job.yaml: field 'methods': ")
    assert f"backend '{backend}' runs dense reference runs only, not 'snapkv'" in message and "'h2o'" in message
    assert "use methods [dense]" in message and "backend hf" in message


def test_every_runnable_job_is_planned():
    assert len(plan_job(job("expert", ["dense"]), load_job_tasks(job("expert", ["dense"]))).keys) == 1
    oracle = job("oracle", ["dense", "snapkv", "nexus"])
    assert len(plan_job(oracle, load_job_tasks(oracle)).keys) == 3


def test_submit_refuses_it_before_anything_is_stored_or_sent(local, tmp_path):  # noqa: F811  (the fixture)
    """What issue 48 saw: ``backend: expert`` with ``methods: [snapkv]`` was accepted, then failed at the worker."""
    db, _env = local
    bad = write_job(tmp_path / "job.yaml", backend="expert", methods=["snapkv"], tasks={"suite": "mini", "ids": [TASK]})
    done = invoke("submit", "--file", str(bad), "--db", db.url)
    assert done.exit_code == 2, done.output
    assert f"{bad}: field 'methods': backend 'expert' runs dense reference runs only, not 'snapkv'" in done.output
    assert "nothing was submitted" in done.output
    with db.session() as s:
        assert (s.query(Job).count(), s.query(Episode).count()) == (0, 0)
    assert not (tmp_path / "celery-broker.db").exists()  # no message was ever sent


def test_the_worker_refuses_a_stored_episode_by_the_same_rule():
    """An episode stored before submit refused it (or written by hand) fails before any container, saying why."""
    spec = job("expert", ["dense"]).model_copy(update={"methods": ["snapkv"]})  # as an old stored job would hold
    episode = spec.episode_config(TASK, "snapkv", spec.scopes[0], spec.protocols[0], spec.seeds[0])
    with pytest.raises(ValueError, match="backend 'expert' runs dense reference runs only, not 'snapkv'"):
        backend_for(episode)


def test_a_stored_job_and_a_replays_extension_of_it_still_read():
    """The refusal is at submit, not in the spec's validation: a stored expert job reads back whatever it held, and
    a replay extends an expert job to the methods its dense runs are replayed under (``jobs.variants``)."""
    stored = job("expert", ["dense"]).model_dump(mode="json")
    assert JobSpec.from_stored({**stored, "methods": ["dense", "snapkv"]}).methods == ["dense", "snapkv"]
    assert job_spec_for(stored, ["snapkv", "h2o"]).methods == ["dense", "snapkv", "h2o"]
