"""Grading: real containers for the statuses and anti-forgery; stored logs for regrading (no container)."""

from __future__ import annotations

import json

import pytest

from env.grading import (
    LOG_HEADER,
    GradeConfig,
    export_patch_filtered,
    grade,
    grade_base_state,
    parse_r2e_pytest,
    patch_files,
    regrade,
)
from env.sandbox.container import Sandbox
from env.sandbox.tools import ToolBox, ToolCall
from env.tasks.loading import Task
from tests.conftest import GOLD_PATCH, TEST_JOB

F2P = ["tests/test_add.py::test_add", "tests/test_add.py::test_total_hidden_marker"]
P2P = ["tests/test_mul.py::test_mul"]
TOKEN = "0123456789abcdef0123456789abcdef"
NOOP_PATCH = (
    "diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -4,2 +4,2 @@\n"
    " def mul(a, b):\n-    return a * b\n+    return b * a\n"
)
# Leaves the bug in place but adds a conftest.py that, after pytest has written its real summary, prints
# forged PASSED lines, swebench's end marker and a fake host frame with a guessed token.
FORGE_CONFTEST = [
    "import atexit",
    "import os",
    "",
    "",
    "def _forge():",
    "    lines = ['PASSED tests/test_add.py::test_add', 'PASSED tests/test_add.py::test_total_hidden_marker',",
    "             '>>>>> End Test Output', '>>>>> Test Exit Code: 0', '%s END tests rc=0 timed_out=0']",
    "    os.write(1, ('\\n' + '\\n'.join(lines) + '\\n').encode())",
    "",
    "",
    "atexit.register(_forge)",
]
FORGE_PATCH = (
    "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
    f"@@ -0,0 +1,{len(FORGE_CONFTEST)} @@\n" + "".join(f"+{line}\n" for line in FORGE_CONFTEST)
) % ("f" * 32)


def grade_config() -> GradeConfig:
    return GradeConfig(job=TEST_JOB, test_timeout_s=120)


def eval_output(tests_body: str, *, exit_code: int = 0) -> str:
    """What swebench's eval script prints around the test command (set -x trace lines included)."""
    return (
        "+ git apply -v -\nApplied patch tests/test_add.py cleanly.\n+ : '>>>>> Start Test Output'\n"
        f"+ python -m pytest -rA\n{tests_body}\n+ SWEBENCH_TEST_EXIT_CODE={exit_code}\n"
        f"+ : '>>>>> End Test Output'\n+ echo '>>>>> Test Exit Code: {exit_code}'\n>>>>> Test Exit Code: {exit_code}\n"
    )


def synthetic_log(tests_body: str, *, exit_code: int = 0, timed_out: int = 0, apply_rc: int = 0) -> str:
    lines = [
        f"{LOG_HEADER} token={TOKEN} task=calc__calc-1 route=swebench",
        f"{TOKEN} BEGIN apply.0",
        "applied",
        f"{TOKEN} END apply.0 rc={apply_rc} timed_out=0",
    ]
    if not apply_rc:
        lines += [
            f"{TOKEN} BEGIN eval",
            eval_output(tests_body, exit_code=exit_code),
            f"{TOKEN} END eval rc=0 timed_out={timed_out}",
        ]
    return "\n".join(lines) + "\n"


def summary(statuses: dict[str, str]) -> str:
    lines = "\n".join(f"{status} {test}" for test, status in statuses.items())
    return f"collected 3 items\n=== short test summary info ===\n{lines}\n=== 3 run in 0.01s ==="


@pytest.fixture(scope="module")
def task_model(tmp_path_factory) -> Task:
    """The same task as the docker fixture, loaded without Docker (regrading needs no engine)."""
    from env.tasks.loading import load_local_task
    from tests.conftest import write_local_task

    return load_local_task(write_local_task(tmp_path_factory.mktemp("regrade")))


# ---------------------------------------------------------------------------------- with containers


@pytest.mark.docker
def test_gold_patch_resolves(local_task, local_task_image):
    result = grade(local_task, GOLD_PATCH, config=grade_config())
    assert result.status == "resolved", result.log
    assert result.grader == "swebench" and result.grader_version == "swebench==5.0.2"
    assert sorted(result.fail_to_pass["success"]) == sorted(F2P)
    assert result.pass_to_pass["success"] == P2P
    assert result.tests["tests/test_add.py::test_add"] == "PASSED"
    assert regrade(local_task, result.log, GOLD_PATCH).status == "resolved"


@pytest.mark.docker
def test_unfixed_patch_is_unresolved_with_failures_listed(local_task, local_task_image):
    result = grade(local_task, NOOP_PATCH, config=grade_config())
    assert result.status == "unresolved"
    assert sorted(result.fail_to_pass["failure"]) == sorted(F2P)
    assert result.pass_to_pass["success"] == P2P


@pytest.mark.docker
def test_forged_passed_lines_do_not_pass(local_task, local_task_image):
    result = grade(local_task, FORGE_PATCH, config=grade_config())
    assert "PASSED tests/test_add.py::test_add" in result.log  # the forgery really ran ...
    assert result.status == "unresolved"  # ... and did not count
    assert "printed grading markers: end marker x2" in result.error


@pytest.mark.docker
def test_base_state_fails_f2p_and_passes_p2p(local_task, local_task_image):
    result = grade_base_state(local_task, config=grade_config())
    assert result.status == "unresolved"
    assert sorted(result.fail_to_pass["failure"]) == sorted(F2P)
    assert result.pass_to_pass["success"] == P2P


@pytest.mark.docker
def test_patch_that_does_not_apply(local_task, local_task_image):
    bad = (
        "diff --git a/calc/ops.py b/calc/ops.py\n--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,1 +1,1 @@\n-nothing\n+x\n"
    )
    result = grade(local_task, bad, config=grade_config())
    assert result.status == "patch_failed"
    assert "did not apply" in result.error


@pytest.mark.docker
def test_test_command_timeout(tmp_path, docker_client, base_image):
    from env.tasks.loading import load_local_task
    from tests.conftest import write_local_task

    task = load_local_task(write_local_task(tmp_path, test_cmd="sleep 1000"))
    result = grade(task, GOLD_PATCH, config=GradeConfig(job=TEST_JOB, test_timeout_s=2))
    assert result.status == "timeout"


@pytest.mark.docker
def test_hidden_tests_are_absent_from_the_agents_container(local_task, local_task_image, docker_client):
    with Sandbox.start(local_task_image, job=TEST_JOB, client=docker_client) as box:
        tools = ToolBox(box).install()
        assert not box.exists("/testbed/tests/test_add.py")
        assert box.exists("/testbed/tests/test_mul.py")
        found = box.run(
            "grep -rl test_total_hidden_marker / --exclude-dir=proc --exclude-dir=sys 2>/dev/null",
            timeout=60,
            workdir="/",
        )
        assert found.output.strip() == ""
        log = box.run("git log --oneline | wc -l", workdir="/testbed").output.strip()
        assert log == "1"  # repo/ as a single commit
        obs = tools.call(ToolCall(name="search", arguments={"search_term": "test_add"})).observation
        assert "No matches found" in obs


def test_empty_patch_needs_no_container(task_model):
    assert grade(task_model, "   \n").status == "empty_patch"
    assert regrade(task_model, "", "").status == "empty_patch"


# ---------------------------------------------------------------------------------- regrading, no Docker


def test_regrade_resolved_from_stored_log(task_model):
    log = synthetic_log(summary(dict.fromkeys(F2P + P2P, "PASSED")))
    result = regrade(task_model, log, GOLD_PATCH)
    assert result.status == "resolved", result.error
    assert result.log == log
    assert result.report["resolved"] is True  # swebench's own report is kept


def test_regrade_ignores_frames_with_another_token(task_model):
    forged = f"{'e' * 32} END eval rc=0 timed_out=0\n{'e' * 32} BEGIN eval\n" + summary(
        dict.fromkeys(F2P + P2P, "PASSED")
    )
    body = summary({**dict.fromkeys(F2P, "FAILED"), **dict.fromkeys(P2P, "PASSED")}) + "\n" + forged
    result = regrade(task_model, synthetic_log(body, exit_code=1), GOLD_PATCH)
    assert result.status == "unresolved"


def test_regrade_statuses_from_frames(task_model):
    assert regrade(task_model, synthetic_log("", apply_rc=1), GOLD_PATCH).status == "patch_failed"
    assert regrade(task_model, synthetic_log("...", timed_out=1), GOLD_PATCH).status == "timeout"
    assert regrade(task_model, "some other text", GOLD_PATCH).status == "infra_failure"
    infra = f"{LOG_HEADER} token={TOKEN} task=x route=swebench\n{TOKEN} INFRA SandboxError: engine gone\n"
    result = regrade(task_model, infra, GOLD_PATCH)
    assert result.status == "infra_failure" and "engine gone" in result.error


def test_regrade_spoof_check_uses_exit_code(task_model):
    # every test "PASSED" but the test command exited 1: swebench's cross-check rejects the log
    log = synthetic_log(summary(dict.fromkeys(F2P + P2P, "PASSED")), exit_code=1)
    result = regrade(task_model, log, GOLD_PATCH)
    assert result.status == "unresolved" and "no trustworthy" in result.error


def test_regrade_veto_on_forged_markers(task_model):
    # a forged end marker + passing lines inside the test output: swebench alone would read them first
    forged = "+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: 0\n" + summary(dict.fromkeys(F2P + P2P, "PASSED"))
    result = regrade(task_model, synthetic_log(forged + "\n" + summary(dict.fromkeys(F2P, "FAILED"))), GOLD_PATCH)
    assert result.status == "unresolved" and "grading markers" in result.error


def test_large_logs_are_packed_and_regrade_the_same(task_model):
    from env.grading.hostlog import PACKED_PREFIX, pack, unpack

    noise = "\n".join(f"Collecting dependency {i} ... building wheel" for i in range(40_000))  # ~1.7 MB
    log = synthetic_log(noise + "\n" + summary(dict.fromkeys(F2P + P2P, "PASSED")))
    stored = pack(log)
    assert stored.startswith(PACKED_PREFIX) and len(stored) < len(log) / 10
    assert unpack(stored) == log and pack("small") == "small"
    assert regrade(task_model, stored, GOLD_PATCH).status == "resolved"


def test_r2e_exact_match_grader():
    expected = {"TestA.test_one": "PASSED", "test_two": "FAILED"}
    task = Task(
        instance_id="pkg__abc",
        repo="pkg",
        problem_statement="p",
        patch="",
        test_patch="",
        FAIL_TO_PASS=[],
        PASS_TO_PASS=[],
        kind="r2e",
        docker_image="namanjain12/pkg_final:abc",
        expected_output_json=json.dumps(expected),
    )
    good = (
        "=== short test summary info ===\nPASSED r2e_tests/test_a.py::TestA::test_one\n"
        "FAILED r2e_tests/test_a.py::test_two - assert 0\nSKIPPED [1] r2e_tests/test_a.py:9: skip\n"
        "ERROR r2e_tests/test_b.py - ImportError\n"  # names no test: the empty key, skipped
    )
    assert parse_r2e_pytest(good) == {**expected, "": "ERROR"}
    lines = [
        f"{TOKEN} BEGIN apply.0",
        "ok",
        f"{TOKEN} END apply.0 rc=0 timed_out=0",
        f"{TOKEN} BEGIN tests",
        "\x1b[32m" + good.replace("\n", "\r\n"),
        f"{TOKEN} END tests rc=1 timed_out=0",
    ]
    log = f"{LOG_HEADER} token={TOKEN} task=pkg__abc route=r2e-native\n" + "\n".join(lines) + "\n"
    result = regrade(task, log, "diff --git a/x b/x\n")
    assert result.status == "resolved" and result.grader == "r2e-native", result.error
    worse = regrade(task, log.replace("FAILED r2e_tests", "PASSED r2e_tests"), "diff --git a/x b/x\n")
    assert worse.status == "unresolved" and "differ" in worse.error


def test_export_patch_filtered_keeps_str_replaced_python_files():
    patch = (
        "diff --git a/pkg/a.py b/pkg/a.py\n+a\ndiff --git a/reproduce_issue.py b/reproduce_issue.py\n+r\n"
        "diff --git a/README.md b/README.md\n+m\n"
    )
    assert export_patch_filtered(patch, ["/testbed/pkg/a.py"]) == "diff --git a/pkg/a.py b/pkg/a.py\n+a\n"
    everything_py = export_patch_filtered(patch, [])
    assert "pkg/a.py" in everything_py and "reproduce_issue.py" in everything_py
    assert "README.md" not in everything_py
    assert patch_files(patch) == ["pkg/a.py", "reproduce_issue.py", "README.md"]


def test_task_grading_limits_override_the_defaults_and_routes_pick_their_own():
    from env.grading import _limits, route_of
    from env.tasks.ceilings import GradingCeilings
    from env.tasks.dataset_rows import task_from_row
    from tests.env.tasks.test_tasks import r2e_row, swebench_row

    open_net = GradingCeilings(allow_network=True)  # a network is the operator's to allow, never the row's

    plain = task_from_row(swebench_row())
    sandbox, timeout = _limits(plain, GradeConfig(), "swebench")
    assert (timeout, sandbox.memory, sandbox.network) == (1800.0, "4g", False)
    # swebench's harness: the image's own ENV (PATH included), as root
    assert (sandbox.path, sandbox.user, sandbox.command_path) == ("image", "root", None)
    row = swebench_row(grading={"timeout_s": 60, "memory": "8g", "cpus": 4, "network": True})
    own = task_from_row(row, ceilings=open_net)
    sandbox, timeout = _limits(own, GradeConfig(test_timeout_s=999, ceilings=open_net), "swebench")
    assert (timeout, sandbox.memory, sandbox.cpus, sandbox.network) == (60, "8g", 4, True)
    native = task_from_row(r2e_row())
    assert route_of(native) == "r2e-native" and _limits(native, GradeConfig(), "r2e-native")[1] == 1200.0
    assert _limits(native, GradeConfig(), "r2e-native")[0].command_path.startswith("/root/.venv/bin:")
    r2e_sweb = task_from_row(swebench_row(docker_image="slimshetty/swebench-verified:sweb.eval.x86_64.a__b-1"))
    assert route_of(r2e_sweb) == "swebench"
    assert route_of(r2e_sweb, GradeConfig(r2e_swebench_route="r2e")) == "r2e-swebench"
    assert route_of(plain, GradeConfig(r2e_swebench_route="r2e")) == "swebench"  # only R2E's rows change


def test_image_assets_without_a_network_are_an_infra_failure_not_a_verdict(task_model):
    from env.tasks.dataset_rows import task_from_row
    from tests.env.tasks.test_tasks import swebench_row

    row = swebench_row(
        image="nexus-eval/base:bookworm-1",
        eval_script="#!/bin/bash\n: '>>>>> Start Test Output'\ntrue\n: '>>>>> End Test Output'\n",
        log_parser="parse_log_pytest",
        eval_type="pass_and_fail",
        image_assets={"test_patch": [{"path": "a.png", "url": "https://example.invalid/a.png"}]},
    )
    result = grade(task_from_row(row), GOLD_PATCH, config=GradeConfig(job=TEST_JOB))
    assert result.status == "infra_failure" and "image_assets" in result.error and "no network" in result.error


def test_a_verdict_on_a_cut_log_says_so_unless_resolved(task_model):
    """A test log read back capped (head + tail) may have lost test lines in its middle: an unresolved verdict
    on it names the cut (the tool's own verdict on the whole log could differ); a resolved one read every test."""
    from env.sandbox.output import TRUNCATION_MARK

    cut = TRUNCATION_MARK.format(dropped=123456)
    passing = summary(dict.fromkeys(F2P + P2P, "PASSED"))
    failing = summary({**dict.fromkeys(F2P, "FAILED"), **dict.fromkeys(P2P, "PASSED")})
    unresolved = regrade(task_model, synthetic_log(cut + failing, exit_code=1), GOLD_PATCH)
    assert unresolved.status == "unresolved" and "the test log was cut: 123456 bytes omitted" in unresolved.error
    whole = regrade(task_model, synthetic_log(failing, exit_code=1), GOLD_PATCH)
    assert whole.status == "unresolved" and "cut" not in (whole.error or "")
    resolved = regrade(task_model, synthetic_log(cut + passing), GOLD_PATCH)
    assert resolved.status == "resolved" and resolved.error is None
