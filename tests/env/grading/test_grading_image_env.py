"""The environment the grading commands get, against the tools' own: on the swebench route, the harness's
(swebench 5.x `run_evaluation`: the image's ENV with its PATH, as root, apply in /testbed, the eval script
in the image's WORKDIR); on the R2E routes, R2E-Gym's (`DOCKER_PATH` over the image's ENV, the image's USER,
/testbed).

The docker tests grade a 5.x row whose eval script runs a tool found only through the image's `ENV PATH`
(as Go, Rust or Node images have theirs), on an image that keeps the default WORKDIR and USER and on one
with `WORKDIR /srv/work` and `USER nobody`; the verdict is checked against swebench's `get_eval_report` on
the same log, and the environment the eval script saw against the one swebench's own `run_instance` gives
it on the same image (its container created with no network, like every container here)."""

from __future__ import annotations

import ast
import hashlib
import re
import tempfile
from pathlib import Path

import pytest

from env.tasks.images import _docker_build, image_exists
from tests.conftest import TEST_JOB, need_r2egym_peer

FAKEGO = '#!/bin/sh\n# a toolchain reached only through the image ENV PATH\nexec /usr/bin/python3 -m pytest "$@"\n'
# each flavour: the Dockerfile lines on top of the official mimic image
FLAVOURS = {
    "env_path": ["ENV PATH=/opt/fakego/bin:$PATH FAKEGO_ROOT=/opt/fakego"],
    "user_workdir": ["ENV PATH=/opt/fakego/bin:$PATH FAKEGO_ROOT=/opt/fakego", "WORKDIR /srv/work", "USER nobody"],
}
ENV_LINE = re.compile(r"^nexus-env (.*)$", re.M)


# ------------------------------------------------------------------------------------------ no Docker


def test_swebench_route_environment_is_the_harness_own():
    from swebench.image_builder.constants import CONTAINER_USER, CONTAINER_WORKDIR

    from env.grading import GradeConfig, _limits, official
    from env.sandbox.config import SandboxConfig
    from env.tasks.dataset_rows import task_from_row
    from tests.env.tasks.test_tasks import swebench_row

    assert (official.SANDBOX["user"], official.APPLY_WORKDIR) == (CONTAINER_USER, CONTAINER_WORKDIR)
    # whatever the defaults say, the route's environment wins
    config = GradeConfig(sandbox=SandboxConfig(path="/opt/x/bin", user="nobody"))
    sandbox, _ = _limits(task_from_row(swebench_row()), config, "swebench")
    assert (sandbox.image_env, sandbox.user, sandbox.command_env()) == (True, "root", {})


def test_r2e_routes_keep_r2e_gyms_path_and_the_images_user():
    from env.grading import GradeConfig, _limits, r2e
    from env.sandbox.config import SandboxConfig
    from env.tasks.dataset_rows import task_from_row
    from tests.env.tasks.test_tasks import r2e_row

    peer = need_r2egym_peer() / "src/r2egym/agenthub/runtime/docker.py"
    tree = ast.parse(peer.read_text())
    docker_path = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DOCKER_PATH"
    )
    assert docker_path == r2e.R2E_PATH
    sandbox, _ = _limits(task_from_row(r2e_row()), GradeConfig(sandbox=SandboxConfig(user="nobody")), "r2e-native")
    assert (sandbox.command_env(), sandbox.user) == ({"PATH": docker_path}, None)


def test_sandbox_config_environment_fields_are_validated():
    from pydantic import ValidationError

    from env.sandbox.config import SANDBOX_PATH, SandboxConfig

    assert SandboxConfig().command_env() == {"PATH": SANDBOX_PATH}  # the agent's, unchanged
    assert SandboxConfig(path="image", env={"A": "1"}).command_env() == {"A": "1"}
    assert SandboxConfig(user="1000:1000").user == "1000:1000"
    for bad in ({"path": "bin:/usr/bin"}, {"path": ""}, {"user": "root; rm -rf /"}, {"user": ""}):
        with pytest.raises(ValidationError):
            SandboxConfig(**bad)


# ------------------------------------------------------------------------------------------ Docker


@pytest.fixture(scope="session")
def env_rows(docker_client, base_image) -> dict[str, dict]:
    """A 5.x row per flavour, on an image built offline on top of the official mimic."""
    from tests.mimic.build import build_all

    template = build_all(docker_client).rows["swebench_5x"]
    official = docker_client.images.get(template["image"]).id
    rows = {}
    for flavour, lines in FLAVOURS.items():
        dockerfile = f"FROM {official}\nCOPY fakego /opt/fakego/bin/fakego\nRUN chmod 755 /opt/fakego/bin/fakego\n"
        dockerfile += "".join(f"{line}\n" for line in lines)
        digest = hashlib.sha256((dockerfile + FAKEGO).encode()).hexdigest()[:16]
        tag = f"nexus-mimic/sweb.eval.x86_64.fakego-{flavour}:{digest}"
        if not image_exists(docker_client, tag):
            with tempfile.TemporaryDirectory(prefix="nexus-mimic-") as ctx:
                Path(ctx, "Dockerfile").write_text(dockerfile)
                Path(ctx, "fakego").write_text(FAKEGO)
                _docker_build(docker_client, ctx, tag, network_mode="none", what=f"mimic image {tag}")
        rows[flavour] = {
            **template,
            "instance_id": f"nexus-mimic__fakego-{flavour.replace('_', '-')}",
            "image": tag,
            "eval_script": _eval_script(template),
        }
    return rows


def _eval_script(row: dict) -> str:
    """The 5.x row's tests, run by `fakego` (on PATH only through the image's ENV) after printing what the
    script sees: working directory, user, HOME, PATH, an image ENV variable."""
    test_file = "tests/test_slug.py"
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            'echo "nexus-env cwd=$(pwd) user=$(id -un) home=$HOME path=$PATH root=${FAKEGO_ROOT:-unset}"',
            "cd /testbed",
            f"git checkout {row['base_commit']} {test_file}",
            "git apply -v - <<'EOF_114329324912'",
            row["test_patch"].rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            f"fakego -rA {test_file}",
            ": '>>>>> End Test Output'",
            f"git checkout {row['base_commit']} {test_file}",
            "",
        ]
    )


def _expected_env(client, image: str) -> str:
    config = client.images.get(image).attrs["Config"]
    path = next(e.split("=", 1)[1] for e in config["Env"] if e.startswith("PATH="))
    return f"cwd={config['WorkingDir'] or '/'} user=root home=/root path={path} root=/opt/fakego"


@pytest.mark.docker
@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_gold_resolves_in_the_images_own_environment_as_swebench_reports(env_rows, docker_client, flavour):
    from env.grading import GradeConfig, grade
    from env.tasks.loading import task_from_row
    from tests.env.grading.test_grading_layouts import eval_log, swebench_report_directly

    row = env_rows[flavour]
    task = task_from_row(row)
    result = grade(task, row["patch"], config=GradeConfig(job=TEST_JOB))
    log = eval_log(result) if result.status != "patch_failed" else result.error
    assert result.status == "resolved", (result.status, result.error, log[-3000:])
    assert "/opt/fakego/bin" in _expected_env(docker_client, row["image"])  # the tool is on the image's PATH
    assert ENV_LINE.findall(log) == [_expected_env(docker_client, row["image"])]
    direct = swebench_report_directly(task, log, row["patch"])
    assert direct["resolved"] is True
    assert result.report["tests_status"] == direct["tests_status"]


class _OfflineContainers:
    """swebench's client with one change: its containers get no network (no container here has one) and our
    test labels (so the session reaps a leftover), instead of SYS_ADMIN, which only browser sandboxes need.
    None of these touches the environment, user or working directory its commands get."""

    def __init__(self, client) -> None:
        self._containers = client.containers

    def __getattr__(self, name):
        return getattr(self._containers, name)

    def create(self, **kwargs):
        from env.sandbox.config import episode_labels

        kwargs.pop("cap_add", None)
        labels = episode_labels(TEST_JOB, "swebench-harness", 900)
        return self._containers.create(**kwargs, network_mode="none", labels=labels)


class _OfflineClient:
    def __init__(self, client) -> None:
        self._client = client
        self.containers = _OfflineContainers(client)

    def __getattr__(self, name):
        return getattr(self._client, name)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_eval_script_sees_what_swebench_run_instance_gives_it(env_rows, docker_client, flavour, tmp_path, monkeypatch):
    from swebench.harness.run_evaluation import run_instance

    from env.grading import GradeConfig, grade
    from env.grading.official import make_spec, spec_row
    from env.tasks.loading import task_from_row
    from tests.env.grading.test_grading_layouts import eval_log

    row = env_rows[flavour]
    task = task_from_row(row)
    ours = grade(task, row["patch"], config=GradeConfig(job=TEST_JOB))
    monkeypatch.chdir(tmp_path)  # the harness writes its logs under ./logs
    prediction = {"instance_id": task.instance_id, "model_name_or_path": "harness", "model_patch": row["patch"]}
    spec = make_spec(spec_row(task, row["image"]))
    outcome = run_instance(spec, prediction, _OfflineClient(docker_client), f"nexus-{TEST_JOB}", timeout=600)
    harness_log = next(tmp_path.glob("logs/run_evaluation/*/harness/*/test_output.txt")).read_text()
    assert outcome is not None, harness_log[-3000:]
    theirs = outcome[1][task.instance_id]
    # the log's tail in the message: a CI run once found no env line here (under heavy load; not reproduced)
    assert ENV_LINE.findall(harness_log) == [_expected_env(docker_client, row["image"])], harness_log[-3000:]
    ours_log = eval_log(ours) if ours.status != "patch_failed" else ours.error
    assert ENV_LINE.findall(ours_log) == ENV_LINE.findall(harness_log)
    assert (ours.status == "resolved", ours.report["tests_status"]) == (theirs["resolved"], theirs["tests_status"])
