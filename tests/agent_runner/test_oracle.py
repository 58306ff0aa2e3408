"""OracleModel (test double) and run_episode: in-process with an Environment double, and end to end in a
real container (marked docker)."""

from __future__ import annotations

import base64
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from agent_runner.agent import AgentConfig
from agent_runner.backends import make_backend
from agent_runner.backends.oracle import APPLIED_MARKER, OracleModel, oracle_script
from agent_runner.parsing import parse_response
from tests.conftest import docker_status, require, run_task_episode

from .conftest import RecordingEnvironment, TinyTask

PATCH = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    " def add(a, b):\n-    return a + b + 1\n+    return a + b\n \n"
)


def test_oracle_script_is_real_r2e_text_that_carries_the_patch_byte_exact():
    script = oracle_script(PATCH)
    calls = [parse_response(text) for text in script]
    assert [p.call.name for p in calls] == ["file_editor", "execute_bash", "finish"]
    assert all(p.thought and p.error is None for p in calls)
    create = calls[0].call.arguments
    assert create["command"] == "create" and create["path"] == "/tmp/gold.patch.b64"
    assert base64.b64decode(create["file_text"]).decode() == PATCH  # trailing "\n \n" survives the trimming
    cmd = calls[1].call.arguments["cmd"]
    assert cmd.split()[0] not in {"git", "ipython", "jupyter", "nohup"} and APPLIED_MARKER in cmd
    with pytest.raises(ValueError, match="empty gold patch"):
        oracle_script("  \n")


def test_oracle_through_the_loop_with_an_environment_double():
    task = TinyTask()
    task.patch = PATCH
    env = RecordingEnvironment(diff_text=PATCH)
    model = make_backend("oracle", task=task)
    result = run_task_episode(task, model, agent=AgentConfig(), grade=False, open_environment=lambda task, **kw: env)
    assert result.exit_status == "submitted" and result.error is None and result.patch == PATCH
    assert [c.name for c in env.calls] == ["file_editor", "execute_bash", "finish"] and env.closed
    assert len(model.observations) == 2 and result.grade is None
    assert set(result.timings) >= {"setup_s", "agent_s", "diff_s", "total_s"}
    with pytest.raises(ValueError, match="gold patch"):
        OracleModel(TinyTask())


def test_run_episode_records_open_and_diff_failures_instead_of_raising():
    task = TinyTask()
    task.patch = PATCH

    def cannot_open(task, **kw):
        raise RuntimeError("image nexus-eval/task-x missing")

    failed = run_task_episode(task, OracleModel(task), open_environment=cannot_open)
    assert failed.exit_status == "infra_failure" and "image nexus-eval/task-x missing" in failed.error
    assert failed.status == "infra_failure" and failed.turns == []

    class DiffBreaks(RecordingEnvironment):
        def diff(self):
            raise OSError("container gone")

    env = DiffBreaks()
    broken = run_task_episode(task, OracleModel(task), open_environment=lambda task, **kw: env)
    assert broken.exit_status == "infra_failure" and "container gone" in broken.error
    assert broken.patch is None and broken.grade is None and env.closed and len(broken.turns) == 3


def _make_local_task(root: Path) -> Path:
    """A one-file task: add() is off by one; the test patch adds the test that shows it."""
    work = root / "work"
    (work / "tests").mkdir(parents=True)
    (work / "calc.py").write_text("def add(a, b):\n    return a + b + 1\n")
    (work / "tests" / "__init__.py").write_text("")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    task_dir = root / "task"
    task_dir.mkdir()
    subprocess.run(["cp", "-r", str(work), str(task_dir / "repo")], check=True)
    subprocess.run(["rm", "-rf", str(task_dir / "repo" / ".git")], check=True)
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    patch = subprocess.run([*git, "diff"], check=True, capture_output=True, text=True).stdout
    subprocess.run([*git, "checkout", "-q", "calc.py"], check=True)
    (work / "tests" / "test_calc.py").write_text(
        textwrap.dedent("""\
        from calc import add


        def test_add():
            assert add(2, 2) == 4
        """)
    )
    subprocess.run([*git, "add", "-A"], check=True)
    test_patch = subprocess.run([*git, "diff", "--cached"], check=True, capture_output=True, text=True).stdout
    (task_dir / "task.json").write_text(
        json.dumps(
            {
                "instance_id": "demo__calc-1",
                "repo": "demo/calc",
                "problem_statement": "add(2, 2) returns 5",
                "patch": patch,
                "test_patch": test_patch,
                "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
                "PASS_TO_PASS": [],
            }
        )
    )
    return task_dir


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_resolves_a_local_task_in_a_real_container(tmp_path):
    ready, reason = docker_status()
    require(ready, reason)
    from env.tasks.loading import load_local_task

    task = load_local_task(_make_local_task(tmp_path))
    turns = []
    result = run_task_episode(task, OracleModel(task), on_turn=turns.append)
    assert result.exit_status == "submitted", result.error
    assert APPLIED_MARKER in turns[1].observation and turns[1].observation.startswith("Exit code: 0")
    assert "+    return a + b\n" in result.patch
    assert result.grade is not None and result.grade_error is None, result.grade_error
    assert result.status == "resolved", result.grade


@pytest.mark.docker
@pytest.mark.slow
def test_submitting_nothing_in_a_real_container_is_an_empty_patch(tmp_path):
    ready, reason = docker_status()
    require(ready, reason)
    from agent_runner.backends.scripted import ScriptedModel
    from env.tasks.loading import load_local_task

    task = load_local_task(_make_local_task(tmp_path))
    model = ScriptedModel(
        [
            "<function=search><parameter=search_term>add</parameter></function>",
            "<function=finish><parameter=command>submit</parameter></function>",
        ]
    )
    result = run_task_episode(task, model)
    assert "calc.py" in result.turns[0].observation  # the real search tool ran in /testbed
    assert result.exit_status == "submitted" and result.patch == ""
    assert result.status == "empty_patch"


def test_grading_runs_through_env_grading_and_is_skipped_after_an_infra_failure():
    from agent_runner.backends.scripted import ScriptedModel

    finish = "<function=finish><parameter=command>submit</parameter></function>"
    nothing = run_task_episode(
        TinyTask(), ScriptedModel([finish]), open_environment=lambda task, **kw: RecordingEnvironment()
    )
    assert nothing.grade is not None and nothing.grade.status == "empty_patch" and nothing.status == "empty_patch"

    env = RecordingEnvironment(fail_on="execute_bash", diff_text=PATCH)
    ls = "<function=execute_bash><parameter=cmd>ls</parameter></function>"
    broken = run_task_episode(TinyTask(), ScriptedModel([ls]), open_environment=lambda task, **kw: env)
    assert broken.exit_status == "infra_failure" and broken.patch == PATCH
    assert broken.grade is None and broken.status == "infra_failure"


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_resolves_the_first_mini_suite_task():
    ready, reason = docker_status()
    require(ready, reason)
    from env.tasks.loading import load_suite

    task = load_suite("mini")[0]
    result = run_task_episode(task, OracleModel(task))
    assert (result.exit_status, result.status) == ("submitted", "resolved"), (result.error, result.grade)


def test_a_lost_diff_is_an_infra_failure_whatever_the_agents_exit_and_its_reason_leads():
    """The engine goes away while the agent runs out of steps: nothing can be graded, so the run is an
    infra_failure whose first line is the lost diff (before: ``step_limit``, then a grade that said only "the
    agent stage left no patch")."""
    from agent_runner.backends.scripted import ScriptedModel

    class DiffBreaks(RecordingEnvironment):
        def diff(self):
            raise OSError("cannot reach the Docker engine")

    ls = "<function=execute_bash><parameter=cmd>ls</parameter></function>"
    opener = lambda task, **kw: DiffBreaks()  # noqa: E731
    broken = run_task_episode(TinyTask(), ScriptedModel([ls]), agent=AgentConfig(max_steps=1), open_environment=opener)
    assert broken.exit_status == "infra_failure" and broken.patch is None and broken.grade is None
    first, *rest = broken.error.splitlines()
    assert first.startswith("taking the diff failed: OSError: cannot reach the Docker engine")
    assert rest[-1] == "the agent had exited with step_limit: reached max_steps=1"
