"""Fixtures for env tests: the real Docker engine, the base image (built once if missing), a small local
task written to a tmp folder, and sandboxes that are always removed (every container these tests create
carries the label `nexus-eval.job=pytest-<pid>`, and the session removes any left over)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import require

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
    from env.sandbox import reap

    reap(older_than_s=0, label_filter={"nexus-eval.job": TEST_JOB}, client=client)


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from env.images import BASE_IMAGE_TAG, build_base_image

    return build_base_image(BASE_IMAGE_TAG, client=docker_client)


@pytest.fixture()
def sandbox(docker_client, base_image):
    from env.sandbox import Sandbox, SandboxConfig

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
    from env.tasks import load_local_task

    return load_local_task(write_local_task(tmp_path_factory.mktemp("tasks")))


@pytest.fixture(scope="session")
def local_task_image(local_task, docker_client) -> str:
    from env.images import ensure_task_image

    return ensure_task_image(local_task, docker_client)
