"""The bundled `mini` suite, checked on the host without Docker (but for one image build, `-m docker`).

The suite is stored as data (`env.tasks.suite_data`): each project's tree once under `_repos/`, each task as
`task.json` + `bug.patch`; every check here runs on the `repo/` the loader materialises from them.
Fast checks (default run): the stored form, structure, hidden tests really hidden, patches touch the right
files, and `git apply --check` of the gold and test patches against a fresh git copy of `repo/`.
Slow check (`-m slow`): run each task's test command with the test patch and no gold patch (every FAIL_TO_PASS
fails, every PASS_TO_PASS passes), then with the gold patch too (everything passes). Results are read with
swebench 5.0.2's `parse_log_pytest`, the parser the grader uses, so the lists are proven to match its ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from env.sandbox.container import Sandbox
from env.tasks.images import ensure_task_image, task_image_tag
from env.tasks.loading import SUITES_DIR, Task, load_suite
from env.tasks.suite_data import BASES_DIR, BUG_PATCH, SUITE_REPO_FIELD
from tests.conftest import TEST_JOB

TASKS = load_suite("mini")
IDS = [t.instance_id for t in TASKS]


def changed_files(diff: str) -> list[str]:
    """Paths a unified diff touches (its `+++ b/...` lines; `/dev/null` for deletions is skipped)."""
    return [line[6:] for line in diff.splitlines() if line.startswith("+++ b/")]


def function_names(test_ids: list[str]) -> set[str]:
    return {test_id.rsplit("::", 1)[1].split("[", 1)[0] for test_id in test_ids}


def git(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, text=True, check=False)


def fresh_checkout(task: Task, dest: Path) -> Path:
    """`repo/` copied and committed as the one commit of a new git repository (what the image holds)."""
    shutil.copytree(task.repo_dir, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for args in (
        ("init", "-q"),
        ("add", "-A"),
        ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"),
    ):
        result = git(*args, cwd=dest)
        assert result.returncode == 0, result.stderr
    return dest


def apply(diff: str, cwd: Path, *, check_only: bool = False) -> None:
    args = ["apply", "--check", "-"] if check_only else ["apply", "-"]
    result = git(*args, cwd=cwd, stdin=diff)
    assert result.returncode == 0, f"git {' '.join(args)} failed: {result.stderr}"


def test_suite_size_and_projects():
    assert len(TASKS) >= 12
    projects = {t.repo for t in TASKS}
    assert len(projects) >= 4
    assert all(sum(t.repo == p for t in TASKS) >= 3 for p in projects)


def test_suite_is_stored_as_data():
    """One base tree per project, each task a small folder; nothing under the suite is source code."""
    suite = SUITES_DIR / "mini"
    assert sorted(p.name for p in suite.iterdir()) == sorted([BASES_DIR, *IDS])
    projects = {json.loads((suite / i / "task.json").read_text())[SUITE_REPO_FIELD] for i in IDS}
    assert sorted(p.name for p in (suite / BASES_DIR).iterdir()) == sorted(f"{p}.patch" for p in projects)
    for task_id in IDS:
        assert sorted(p.name for p in (suite / task_id).iterdir()) == [BUG_PATCH, "task.json"]
        assert (suite / task_id / BUG_PATCH).stat().st_size < 4096, "a bug patch holds the bug, not a tree"
    assert not list(suite.rglob("*.py"))
    assert not any(t.local_dir.is_relative_to(SUITES_DIR) for t in TASKS), "trees are materialised elsewhere"


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_task_structure(task: Task):
    assert task.kind == "local"
    assert task.local_dir.name == task.instance_id
    assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
    assert task.test_cmd == "python -m pytest -rA"
    # The gold patch changes source only; the test patch changes tests only.
    assert changed_files(task.patch) and all(not f.startswith("tests/") for f in changed_files(task.patch))
    assert changed_files(task.test_patch) and all(f.startswith("tests/") for f in changed_files(task.test_patch))
    for test_id in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        assert re.fullmatch(r"tests/test_\w+\.py::test_\w+", test_id), test_id


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_hidden_tests_are_not_in_repo(task: Task):
    """The agent's tree must not contain the tests that grade it, and the issue must not name them."""
    sources = "\n".join(p.read_text() for p in task.repo_dir.rglob("*.py"))
    for name in function_names(task.FAIL_TO_PASS):
        assert f"def {name}(" not in sources, name
        assert name not in task.problem_statement, name
    for name in function_names(task.PASS_TO_PASS):
        assert f"def {name}(" in sources or f"def {name}(" in task.test_patch, name


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_patches_apply_to_a_fresh_copy(task: Task, tmp_path: Path):
    checkout = fresh_checkout(task, tmp_path / "testbed")
    apply(task.patch, checkout, check_only=True)
    apply(task.test_patch, checkout, check_only=True)
    apply(task.test_patch, checkout)
    apply(task.patch, checkout, check_only=True)


def run_tests(task: Task, cwd: Path) -> tuple[dict[str, str], str]:
    """Run the task's test command with the host's interpreter; parse the log as the grader does."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    argv = shlex.split(task.test_cmd)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The task image has plain pytest; the host's extra plugins would only slow each run down.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    result = subprocess.run(
        argv + ["-p", "no:cacheprovider"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    log = result.stdout + result.stderr
    return parse_log_pytest(log, None), log


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_lists_match_real_test_runs(task: Task, tmp_path: Path):
    checkout = fresh_checkout(task, tmp_path / "testbed")
    apply(task.test_patch, checkout)
    before, log = run_tests(task, checkout)
    for test_id in task.FAIL_TO_PASS:
        assert before.get(test_id) in ("FAILED", "ERROR"), f"{test_id} is {before.get(test_id)} without the fix\n{log}"
    for test_id in task.PASS_TO_PASS:
        assert before.get(test_id) == "PASSED", f"{test_id} is {before.get(test_id)} at the base state\n{log}"

    apply(task.patch, checkout)
    after, log = run_tests(task, checkout)
    for test_id in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        assert after.get(test_id) == "PASSED", f"{test_id} is {after.get(test_id)} with the gold patch\n{log}"
    # Nothing the grader sees is left out of the lists, and nothing else fails.
    assert set(after) == set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS)
    assert set(after.values()) == {"PASSED"}


@pytest.mark.docker
def test_image_holds_the_materialised_tree(docker_client, base_image):
    """A task image is built from the materialised tree: /testbed holds exactly its files, in one commit."""
    task = TASKS[0]
    image = ensure_task_image(task, docker_client)
    assert image == task_image_tag(task, docker_client.images.get(base_image).id)
    files = sorted(p.relative_to(task.repo_dir).as_posix() for p in task.repo_dir.rglob("*") if p.is_file())
    with Sandbox.start(image, job=TEST_JOB, client=docker_client) as box:
        assert box.run("git rev-list --count HEAD", workdir="/testbed").output.strip() == "1"
        assert box.run("git ls-files", workdir="/testbed").output.split() == files
        sums = box.run("sha256sum " + " ".join(files), workdir="/testbed").output.split()[::2]
    assert sums == [hashlib.sha256((task.repo_dir / f).read_bytes()).hexdigest() for f in files]
