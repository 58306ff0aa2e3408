"""Every file in examples/ is what its README says and validates: job files as jobs, the deployment as the
service's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.job_file import AGENT_CASE_JOB_FILE, QUICK_JOB_FILE
from jobs.settings import ServiceSettings
from jobs.spec import JobSpec
from jobs.submit import load_job_tasks, plan_episodes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
JOB_FILES = sorted(EXAMPLES.glob("*.yaml"))


def test_the_readme_lists_every_example():
    readme = (EXAMPLES / "README.md").read_text()
    files = {p.name for p in EXAMPLES.iterdir() if p.name != "README.md"}
    assert files == {"quick.yaml", "agent_case.yaml", "table3-swebench-verified.yaml", "deployment.env"}
    for name in files:
        assert f"`{name}`" in readme, name


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.name for p in JOB_FILES])
def test_every_job_file_validates(path):
    spec = JobSpec.from_yaml(path)
    spec.check_with_library(source=str(path))  # every method's settings, by building its policy
    spec.check_backend_methods(source=str(path))  # its backend runs each of its methods (what submit refuses)
    assert spec.name  # each example names itself, so its jobs are findable in `nexus-eval status`


def test_the_quick_job_is_the_bundled_one_and_fans_out_over_local_tasks():
    assert (EXAMPLES / "quick.yaml").resolve() == QUICK_JOB_FILE.resolve()
    spec = JobSpec.from_yaml(QUICK_JOB_FILE)
    keys = plan_episodes(spec, load_job_tasks(spec))
    assert len(keys) == 2 * 3  # 2 tasks x (dense, snapkv, nexus) in the default cell
    assert spec.model.name == "tiny" and spec.sampling.max_new_tokens == 48


def test_the_table3_job_is_the_papers_grid():
    spec = JobSpec.from_yaml(EXAMPLES / "table3-swebench-verified.yaml")
    assert len(spec.methods) == 10 and spec.density == 0.2 and spec.preset == "paper"
    assert set(spec.scopes) == {"prefill_only", "prefill_decode"}
    assert set(spec.protocols) == {"true_eviction", "full_context"}
    assert (spec.limits.max_steps, spec.limits.soft_step_limit, spec.limits.max_context_tokens) == (100, 40, 65536)
    assert spec.sampling.temperature == 1.0 and spec.sampling.max_new_tokens is None


def test_the_deployment_settings_validate_and_stay_on_loopback():
    environ = {}
    for line in (EXAMPLES / "deployment.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            environ[key.strip()] = value.strip()
    settings = ServiceSettings.from_env(environ)
    assert settings.broker_url.startswith("redis://127.0.0.1:") and not settings.embedded
    assert settings.db_url.startswith("postgresql+psycopg://") and "@127.0.0.1:" in settings.db_url
    assert (settings.episodes_per_gpu, settings.device) == (8, "cuda:0")
    assert settings.hard_time_limit_s > settings.soft_time_limit_s


def test_the_agent_case_is_the_bundled_expert_job():
    assert (EXAMPLES / "agent_case.yaml").resolve() == AGENT_CASE_JOB_FILE.resolve()
    spec = JobSpec.from_yaml(AGENT_CASE_JOB_FILE)
    assert spec.backend == "expert" and spec.methods == ["dense"]
    assert len(plan_episodes(spec, load_job_tasks(spec))) == 2
