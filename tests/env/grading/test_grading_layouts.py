"""Grading fidelity on images that reproduce each layout (tests/mimic): the official SWE-bench layout
(5.x and classic rows), R2E-Gym's SWE-bench images and R2E-native images. Every verdict is checked against
the row's own tool run directly on the same log: swebench's `get_eval_report`, and R2E-Gym's reward
functions read from its published `runtime/docker.py` (../shared/peers/r2egym) and executed here."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from env.grading import GradeConfig, grade, grade_base_state, hostlog
from env.tasks.loading import task_from_row
from tests.conftest import TEST_JOB, docker_status, need_r2egym_peer, r2egym_peer, require

pytestmark = [pytest.mark.docker, pytest.mark.slow]
PEER_DOCKER_PY = r2egym_peer() / "src/r2egym/agenthub/runtime/docker.py"
OFFICIAL = ("swebench_5x", "swebench_classic")


@pytest.fixture(scope="session")
def mimics():
    ready, reason = docker_status()
    require(ready, reason)
    from env.tasks.images import docker_client
    from tests.mimic.build import build_all

    return build_all(docker_client())


def config(**kw) -> GradeConfig:
    return GradeConfig(job=TEST_JOB, **kw)


def eval_log(result) -> str:
    section = "eval" if result.grader == "swebench" else "tests"
    return hostlog.parse(hostlog.unpack(result.log)).sections[section].body


def swebench_report_directly(task, log_text: str, patch: str) -> dict:
    """swebench's get_eval_report on the captured log, with the spec built by swebench from the row."""
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import make_test_spec

    from env.grading.official import spec_row

    spec = make_test_spec(spec_row(task, "mimic"))
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as handle:
        handle.write(log_text)
    try:
        prediction = {"instance_id": task.instance_id, "model_name_or_path": "direct", "model_patch": patch}
        return get_eval_report(spec, prediction, handle.name, include_tests_status=True)[task.instance_id]
    finally:
        Path(handle.name).unlink()


# ------------------------------------------------------------------------- the official SWE-bench layout


@pytest.mark.parametrize("flavour", OFFICIAL)
def test_official_layout_gold_resolves_through_conda_and_a_megabyte_of_install_output(mimics, flavour):
    task = task_from_row(mimics.rows[flavour])
    result = grade(task, mimics.patches[flavour]["gold"], config=config())
    assert result.status == "resolved", result.error
    log = eval_log(result)
    assert len(log) > 1_000_000 and "Building wheel for dependency-29999" in log  # install output, uncapped
    assert "+ conda activate testbed" in log
    assert result.grader == "swebench" and result.grader_version.startswith("swebench==5.0.2")
    if flavour == "swebench_classic":  # no eval_script in the row: swebench 4.1.0 wrote it
        assert task.eval_script is None and result.grader_version.endswith("spec from swebench==4.1.0")
        assert "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 utils_tests.test_text" in log
    direct = swebench_report_directly(task, log, mimics.patches[flavour]["gold"])
    assert direct["resolved"] is True and direct["tests_status"]["FAIL_TO_PASS"] == result.fail_to_pass


@pytest.mark.parametrize("flavour", OFFICIAL)
def test_official_layout_base_state_and_empty_patch_do_not_resolve(mimics, flavour):
    task = task_from_row(mimics.rows[flavour])
    base = grade_base_state(task, config=config())
    assert base.status == "unresolved" and base.fail_to_pass["failure"] == task.FAIL_TO_PASS
    assert base.pass_to_pass["success"] == task.PASS_TO_PASS
    assert grade(task, "", config=config()).status == "empty_patch"


@pytest.mark.parametrize("name", ["skip", "forge"])
def test_official_layout_skipping_or_forging_does_not_resolve_and_matches_swebench(mimics, name):
    task = task_from_row(mimics.rows["swebench_classic"])
    patch = mimics.patches["swebench_classic"][name]
    result = grade(task, patch, config=config())
    assert result.status == "unresolved"
    log = eval_log(result)
    if name == "skip":
        assert "test_truncate_words (utils_tests.test_text.TextTests) ... skipped" in log
    else:  # the forged line was printed after the real failure, and the runner exited 1
        lines = log.splitlines()
        real = lines.index("test_truncate_words (utils_tests.test_text.TextTests) ... FAIL")
        assert "test_truncate_words (utils_tests.test_text.TextTests) ... ok" in lines[real + 1 :]
        assert "no trustworthy test results" in result.error
    assert swebench_report_directly(task, log, patch)["resolved"] is False


def test_a_test_run_past_its_limit_is_a_timeout(mimics):
    row = {**mimics.rows["swebench_5x"], "grading": {"timeout_s": 3}}
    row["eval_script"] = row["eval_script"].replace("pytest -rA", "sleep 60; pytest -rA")
    result = grade(task_from_row(row), mimics.patches["swebench_5x"]["gold"], config=config())
    assert result.status == "timeout"


# ------------------------------------------------------------------------- R2E-Gym's SWE-bench images


def test_r2e_swebench_rows_take_the_official_route_by_default_with_the_same_verdicts(mimics):
    task = task_from_row(mimics.rows["r2e_swebench"])
    verdicts = {
        name: grade(task, patch, config=config()).status for name, patch in mimics.patches["r2e_swebench"].items()
    }
    assert verdicts == {"gold": "resolved", "skip": "unresolved", "forge": "unresolved"}
    assert grade_base_state(task, config=config()).status == "unresolved"


R2E_SWEBENCH_DIRECT = r"""
import ast, json, sys
import swebench.harness.test_spec.test_spec as ts
ts.make_env_script_list = lambda *a, **k: []  # the env script fetches requirements online; unused here
from swebench.harness.constants import *  # noqa: the names R2E-Gym's runtime imports
from swebench.harness.grading import get_eval_tests_report, get_resolution_status
from swebench.harness.log_parsers import MAP_REPO_TO_PARSER, get_eval_type
from swebench.harness.test_spec.test_spec import TestSpec
peer, row, log = sys.argv[1], json.loads(sys.argv[2]), sys.stdin.read()
tree = ast.parse(open(peer).read())
runtime = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DockerRuntime")
names = ("get_logs_eval", "_calculate_reward_swebench")
wanted = [f for f in runtime.body if isinstance(f, ast.FunctionDef) and f.name in names]
ns = dict(globals())
exec(compile(ast.Module(body=wanted, type_ignores=[]), peer, "exec"), ns)
class Log:
    def info(self, *a): pass
    error = info
class Runtime:
    logger = Log()
    test_spec = ts.make_test_spec(row)
    def run(self, code, timeout):
        return log, "0"
Runtime.get_logs_eval = ns["get_logs_eval"]
print(json.dumps(ns["_calculate_reward_swebench"](Runtime())))
"""


def r2e_gym_swebench_reward(row: dict, log: str) -> int:
    """R2E-Gym's own `_calculate_reward_swebench` + `get_logs_eval` (read from its docker.py) on `log`, run in
    the swebench 3.0.2 environment R2E-Gym pins."""
    from env.tasks.swebench_legacy import legacy_python

    proc = subprocess.run(
        [str(legacy_python("3.0.2")), "-c", R2E_SWEBENCH_DIRECT, str(PEER_DOCKER_PY), json.dumps(row)],
        input=log,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_r2e_route_on_r2e_swebench_images_equals_r2e_gyms_own_reward(mimics):
    need_r2egym_peer()
    row = mimics.rows["r2e_swebench"]
    task = task_from_row(row)
    seen = {}
    for name, patch in mimics.patches["r2e_swebench"].items():
        result = grade(task, patch, config=config(r2e_swebench_route="r2e"))
        assert result.grader == "r2e-swebench" and "swebench==3.0.2" in result.grader_version
        log = eval_log(result)
        assert "+ conda activate testbed" in log  # /run_tests.sh, baked into the image, ran
        assert (result.status == "resolved") == bool(r2e_gym_swebench_reward(row, log)), name
        seen[name] = result.status
    # R2E-Gym's in-loop reward (swebench 3.x membership, no exit-code check) accepts a skipped F2P test
    # and a forged "ok" line: that is why the official route is the default (docs/tasks.md).
    assert seen == {"gold": "resolved", "skip": "resolved", "forge": "resolved"}
    assert grade_base_state(task, config=config(r2e_swebench_route="r2e")).status == "unresolved"


# ------------------------------------------------------------------------- R2E-native images


def r2e_gym_native_reward(row: dict, log: str) -> float:
    """R2E-Gym's `_calculate_reward_r2e` read from its docker.py and run on `log`. Its parser and key
    decolouring live in modules the snapshot does not carry: the parser is ours (checked on its own in
    test_grading), the decolouring is R2E's one-line rule."""
    tree = ast.parse(PEER_DOCKER_PY.read_text())
    runtime = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DockerRuntime")
    function = next(f for f in runtime.body if isinstance(f, ast.FunctionDef) and f.name == "_calculate_reward_r2e")
    from env.grading import parse_r2e_pytest

    ns = {"json": json, "decolor_dict_keys": lambda d: {re.sub(r"\x1b\[\d+m", "", k): v for k, v in d.items()}}
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(PEER_DOCKER_PY), "exec"), ns)

    class Runtime:
        ds = row

        def run_tests(self):
            return re.sub(r"\x1b\[[0-9;]*m|\r", "", log), "0"

        def parse_logs(self, output):
            return parse_r2e_pytest(output)

    return ns["_calculate_reward_r2e"](Runtime())


def test_r2e_native_verdicts_equal_r2e_gyms_reward(mimics):
    need_r2egym_peer()
    row = mimics.rows["r2e_native"]
    task = task_from_row(row)
    assert task.problem_statement == "\nmul(2, 3) returns 5.\n"
    results = {name: grade(task, patch, config=config()) for name, patch in mimics.patches["r2e_native"].items()}
    results["base"] = grade_base_state(task, config=config())
    assert {k: r.status for k, r in results.items()} == {
        "gold": "resolved",
        "overfix": "unresolved",
        "base": "unresolved",
    }
    for name, result in results.items():
        assert result.grader == "r2e-native"
        assert (result.status == "resolved") == (r2e_gym_native_reward(row, eval_log(result)) == 1.0), name
    assert "test_neg_is_still_broken_upstream" in results["overfix"].error


def test_r2e_native_oracle_episode_diff_leaves_the_image_files_out_and_resolves(mimics):
    from agent_runner.backends.oracle import OracleModel
    from tests.conftest import run_task_episode

    task = task_from_row(mimics.rows["r2e_native"])
    result = run_task_episode(task, OracleModel(task), labels={"nexus-eval.job": TEST_JOB})
    assert result.exit_status == "submitted"
    assert result.patch.startswith("diff --git a/calcpkg/ops.py b/calcpkg/ops.py"), result.patch[:500]
    for leftover in ("install.sh", "run_tests.sh", "setup.cfg", ".venv", "r2e_tests"):
        assert leftover not in result.patch
    assert result.grade is not None and result.grade.status == "resolved", result.grade


def test_r2e_native_hidden_tests_are_not_in_the_agents_container(mimics):
    from agent_runner.environment import DockerEnvironment
    from env.sandbox.tools import ToolCall

    task = task_from_row(mimics.rows["r2e_native"])
    with DockerEnvironment.open(task, job=TEST_JOB) as env:
        listing = env.sandbox.run("ls -a /testbed /root /; ls /r2e_tests 2>&1", workdir="/").output
        assert "run_tests.sh" not in listing and "r2e_tests" not in listing.replace(
            "ls: cannot access '/r2e_tests'", ""
        )
        assert env.sandbox.exists("/testbed/install.sh")  # the image's own files stay
        obs = env.step(ToolCall(name="search", arguments={"search_term": "broken_upstream", "path": "/"})).observation
        assert "broken_upstream" not in obs.replace('"broken_upstream"', "").replace("'broken_upstream'", "")
        assert env.diff() == ""


# ------------------------------------------------------------------------- the CLI on every flavour


def validate_cli(rows: list[dict], path: Path, *extra: str) -> dict:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "nexus_eval.cli", "tasks", "validate", "--file", str(path), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {(v["instance_id"], v["grader"]): v["valid"] for v in json.loads(proc.stdout)}


def test_tasks_validate_on_every_flavour(mimics, tmp_path):
    native_id = task_from_row(mimics.rows["r2e_native"]).instance_id
    rows = [mimics.rows[k] for k in ("swebench_5x", "swebench_classic", "r2e_native")]
    assert validate_cli(rows, tmp_path / "rows.jsonl") == {
        ("nexus-mimic__textkit-2", "swebench"): True,
        ("django__django-99001", "swebench"): True,
        (native_id, "r2e-native"): True,
    }
    r2e = [mimics.rows["r2e_swebench"]]
    assert validate_cli(r2e, tmp_path / "r2e.jsonl") == {("django__django-99001", "swebench"): True}
    assert validate_cli(r2e, tmp_path / "r2e.jsonl", "--r2e-route") == {("django__django-99001", "r2e-swebench"): True}
