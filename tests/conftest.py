"""Shared test plumbing.

Markers: `docker` (a real engine), `services` (real Redis + PostgreSQL on 127.0.0.1), `slow`, `gpu`.
Tests that need an outside part skip with a reason when it is missing on a developer's machine,
but under CI (`CI=true`) a missing part is a failure: CI starts everything, so a skip there would
hide a broken install step.
"""

from __future__ import annotations

import json
import os
import random
import textwrap
from pathlib import Path

import pytest
import torch

from agent_runner.config import SMOLLM2, ModelSpec
from agent_runner.model_host import load_host
from agent_runner.real_models import ensure_preset, is_ready, preset_path

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# One intra-op thread: the tiny models gain nothing from more, and on a 2-core machine shared with Docker
# containers and services, OpenMP threads spinning against each other made single decode steps 100x slower.
torch.set_num_threads(1)


def require(condition: bool, reason: str) -> None:
    """Skip locally, fail under CI, when an outside part the test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def r2egym_peer() -> Path:
    """R2E-Gym's published files (the reference for differential tests): `$NEXUS_R2EGYM_PEER`, else
    `shared/peers/r2egym` beside the checkout, else the workplace's `/work/shared/peers/r2egym`. Tests that
    need it skip when it is absent, even in CI: it is reference material outside the repository, not an
    install step."""
    if os.environ.get("NEXUS_R2EGYM_PEER"):
        return Path(os.environ["NEXUS_R2EGYM_PEER"])
    candidates = [Path(__file__).resolve().parents[1].parent / "shared/peers/r2egym", Path("/work/shared/peers/r2egym")]
    return next((p for p in candidates if p.is_dir()), candidates[0])


def need_r2egym_peer() -> Path:
    peer = r2egym_peer()
    if not (peer / "src/r2egym").is_dir():
        pytest.skip(f"R2E-Gym peer snapshot not found at {peer} (set NEXUS_R2EGYM_PEER)")
    return peer


def docker_status() -> tuple[bool, str]:
    """(ready, reason): a Docker engine answers and the offline base image exists (sandboxes need both)."""
    try:
        from env.tasks.images import BASE_IMAGE_TAG, docker_client, image_exists

        client = docker_client()
        client.ping()
    except Exception as exc:  # any failure to reach the engine means "not ready", with its reason
        return False, f"no Docker engine: {exc}"
    if not image_exists(client, BASE_IMAGE_TAG):
        return False, f"base image {BASE_IMAGE_TAG} missing (nexus-eval images build-base)"
    return True, ""


def pytest_addoption(parser):
    parser.addoption(
        "--matrix-seed",
        type=int,
        default=None,
        help="seed of the sample each `matrix(keep=K)` test runs of its parameter matrix (default: a new one each "
        "run, printed in the header; give it to rerun the same sample)",
    )
    parser.addoption("--matrix-full", action="store_true", help="run every cell of every `matrix` test")


def matrix_seed(config) -> int:
    """This run's matrix seed: given, or drawn once per run (and printed by :func:`pytest_report_header`)."""
    if not hasattr(config, "_matrix_seed"):
        given = config.getoption("--matrix-seed")
        config._matrix_seed = given if given is not None else random.SystemRandom().randrange(10**6)
    return config._matrix_seed


def pytest_report_header(config):
    if config.getoption("--matrix-full"):
        return "matrix tests: every cell (--matrix-full)"
    return f"matrix tests: a seeded sample of each matrix, --matrix-seed {matrix_seed(config)} (--matrix-full: all)"


def sample_matrices(config, items) -> list:
    """Exhaustive matrices keep their coverage across runs, not their wall time in each: of each test's items
    (one function of one file) marked ``matrix(keep=K)``, K are kept (drawn with this run's seed, by the items'
    ids, so a seed names the same sample on any machine), plus every item marked ``matrix(always=True)``.
    Returns the dropped items."""
    if config.getoption("--matrix-full"):
        return []
    groups: dict[str, list] = {}
    for item in items:
        mark = item.get_closest_marker("matrix")
        if mark is not None and not mark.kwargs.get("always"):
            groups.setdefault(item.nodeid.split("[")[0], []).append(item)  # file::function: names repeat
    rng = random.Random(matrix_seed(config))
    dropped = []
    for name in sorted(groups):
        group = sorted(groups[name], key=lambda i: i.nodeid)
        keep = group[0].get_closest_marker("matrix").kwargs["keep"]
        kept = set(rng.sample(range(len(group)), min(keep, len(group))))
        dropped += [item for index, item in enumerate(group) if index not in kept]
    return dropped


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
    dropped = sample_matrices(config, items)
    if dropped:
        gone = {id(item) for item in dropped}
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if id(item) not in gone]


def run_task_episode(task, model, *, agent=None, grade: bool = True, seed: int = 0, **hooks):
    """The one episode runner (``agent_runner.episode.run_episode``) on an already-loaded ``task`` with a given
    backend (a test double: scripted, oracle), as every CLI and worker episode runs. ``hooks``: the fields of
    ``agent_runner.episode.EpisodeHooks`` (``open_environment=...``, ``labels=...``)."""
    from agent_runner.config import AgentConfig, EpisodeSpec
    from agent_runner.episode import EpisodeHooks, run_episode

    spec = EpisodeSpec(
        suite="mini",
        task_id=task.instance_id,
        backend="hf",
        protocol="true_eviction",
        agent=agent or AgentConfig(),
        grade=grade,
        seed=seed,
        eviction={"method": "dense"},
    )
    return run_episode(spec, task=task, model=model, hooks=EpisodeHooks(**hooks))


# -- the real model preset (smollm2-135m), loaded once per test session ------------------------------------------


@pytest.fixture(scope="session")
def smollm2_path():
    """The converted folder (torch runs on one thread in tests: the fast choice on 2 cores)."""
    if not is_ready(SMOLLM2):
        if IN_CI:
            pytest.fail(f"required in CI: model {SMOLLM2} is not set up (run .ci/parts/35-models.sh)")
        try:
            ensure_preset(SMOLLM2)
        except ValueError as exc:
            require(False, f"cannot set up model {SMOLLM2} here: {exc}")
    return preset_path(SMOLLM2)


@pytest.fixture(scope="session")
def smollm2_host(smollm2_path):
    """The model host as a worker loads it (float32 on CPU, `nexus.prepare`d)."""
    return load_host(ModelSpec(name=SMOLLM2, device="cpu"))


@pytest.fixture(scope="session")
def smollm2_plain(smollm2_path):
    """The same weights through plain transformers: not prepared, its own attention and caches."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


# --- Docker: the real daemon, the base image (built once if missing), a small local task written to a tmp folder,
# and sandboxes that are always removed (every container these tests create carries the label
# `nexus-eval.job=pytest-<pid>`, and the session removes any left over). Used by tests/sandbox, tasks, grading.

TEST_JOB = f"pytest-{os.getpid()}"

CALC_INIT = textwrap.dedent(
    """\
    from calc.ops import add, mul


    def total(values):
        result = 0
        for value in values:
            result = add(result, value)
        return result
    """
)
CALC_OPS = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_MUL = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
GOLD_PATCH = (
    "diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,5 +1,5 @@\n"
    " def add(a, b):\n-    return a - b\n+    return a + b\n \n \n def mul(a, b):\n"
)
TEST_PATCH = """diff --git a/tests/test_add.py b/tests/test_add.py
new file mode 100644
--- /dev/null
+++ b/tests/test_add.py
@@ -0,0 +1,9 @@
+from calc import add, total
+
+
+def test_add():
+    assert add(2, 3) == 5
+
+
+def test_total_hidden_marker():
+    assert total([1, 2, 3]) == 6
"""


def write_local_task(
    root: Path, *, instance_id: str = "calc__calc-1", test_cmd: str | None = None, setup: list[str] | None = None
) -> Path:
    """A tiny local task: `add` subtracts; the hidden tests in TEST_PATCH fail until the gold patch."""
    task_dir = root / instance_id
    (task_dir / "repo" / "calc").mkdir(parents=True)
    (task_dir / "repo" / "tests").mkdir()
    (task_dir / "repo" / "calc" / "__init__.py").write_text(CALC_INIT)
    (task_dir / "repo" / "calc" / "ops.py").write_text(CALC_OPS)
    (task_dir / "repo" / "tests" / "test_mul.py").write_text(TEST_MUL)
    spec = {
        "instance_id": instance_id,
        "repo": "nexus/calc",
        "problem_statement": "add(2, 3) returns -1 instead of 5.",
        "patch": GOLD_PATCH,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": ["tests/test_add.py::test_add", "tests/test_add.py::test_total_hidden_marker"],
        "PASS_TO_PASS": ["tests/test_mul.py::test_mul"],
    }
    if test_cmd:
        spec["test_cmd"] = test_cmd
    if setup:
        spec["setup"] = setup
    (task_dir / "task.json").write_text(json.dumps(spec, indent=2))
    return task_dir


def _engine():
    try:
        import docker

        client = docker.from_env(timeout=300)
        client.ping()
        return client
    except Exception:
        return None


@pytest.fixture(scope="session")
def docker_client():
    client = _engine()
    require(client is not None, "no Docker engine reachable (run `bash .ci/parts/20-docker.sh`)")
    yield client
    from env.sandbox.reaping import reap

    reap(older_than_s=0, label_filter={"nexus-eval.job": TEST_JOB}, client=client)


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from env.tasks.images import BASE_IMAGE_TAG, build_base_image

    return build_base_image(BASE_IMAGE_TAG, client=docker_client)


@pytest.fixture()
def sandbox(docker_client, base_image):
    from env.sandbox.config import SandboxConfig
    from env.sandbox.container import Sandbox

    box = Sandbox.start(
        base_image, config=SandboxConfig(max_output_bytes=64 * 1024), job=TEST_JOB, client=docker_client
    )
    try:
        box.check("mkdir -p /testbed", workdir="/")
        yield box
    finally:
        box.close()


@pytest.fixture(scope="session")
def local_task(tmp_path_factory, docker_client, base_image):
    from env.tasks.loading import load_local_task

    return load_local_task(write_local_task(tmp_path_factory.mktemp("tasks")))


@pytest.fixture(scope="session")
def local_task_image(local_task, docker_client) -> str:
    from env.tasks.images import ensure_task_image

    return ensure_task_image(local_task, docker_client)


@pytest.fixture(autouse=True)
def _own_celery_app(monkeypatch):
    """Each test builds its own process Celery app (``jobs.queue.get_app``: one per process, from the first
    settings asked for): a CLI verb invoked in-process by one test must not decide the broker of the next."""
    import jobs.queue

    monkeypatch.setattr(jobs.queue, "_APP", [])
