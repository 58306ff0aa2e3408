"""Grading an episode's patch in a fresh container, and re-grading from a stored log.

Two graders behind `grade()` / `regrade()`:
* `swebench` (every task with FAIL_TO_PASS / PASS_TO_PASS: local, swebench, r2e_swebench): the `swebench`
  package's log parser, `get_logs_eval` (incl. its exit-code spoof check), `get_eval_tests_report` and
  `get_resolution_status`; resolved iff RESOLVED_FULL.
* `r2e-exact-match` (R2E-native rows): R2E-Gym's pytest summary parsing (text after "short test summary
  info", node id minus the file path joined with ".", " - " suffix cut, ANSI removed, XFAIL/SKIPPED ignored)
  compared key-for-key with `expected_output_json`.

The grading container starts from the task image with nothing of the agent's container but the patch. The
log is written by the host: its first line carries a random token, and every section the container
produced (model patch, test patch, tests) is framed by `<token> BEGIN/END <name> rc=N timed_out=0|1`
lines the host adds around the exec's output, with the exit code from the engine. The token never enters
the container, so no output of the patched code can forge a frame, an exit code or a status; `regrade()`
reads the LAST frame of each section. `grade()` itself derives its status through `regrade()`.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Iterable
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from env.sandbox import Sandbox, SandboxConfig, SandboxError

Status = Literal["resolved", "unresolved", "empty_patch", "patch_failed", "timeout", "infra_failure"]
SWEBENCH_GRADER = "swebench"
R2E_GRADER = "r2e-exact-match"
R2E_GRADER_VERSION = "nexus-eval-1 (R2E-Gym parse_log_pytest semantics)"
LOG_HEADER = "NEXUS-EVAL GRADE LOG v1"
WORK = "/tmp/nexus_grade"
# swebench 5.x rows carry `log_parser`; classic rows are keyed by repo as in swebench 3.x/4.x.
REPO_LOG_PARSERS = {
    "django/django": "parse_log_django",
    "sympy/sympy": "parse_log_sympy",
    "matplotlib/matplotlib": "parse_log_matplotlib",
    "mwaskom/seaborn": "parse_log_seaborn",
    "sphinx-doc/sphinx": "parse_log_sphinx",
    "astropy/astropy": "parse_log_astropy",
    "psf/requests": "parse_log_requests",
    "pydata/xarray": "parse_log_xarray",
}
DEFAULT_LOG_PARSER = "parse_log_pytest"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class GradeConfig(BaseModel):
    """Limits for one grading run."""

    sandbox: SandboxConfig = Field(default_factory=lambda: SandboxConfig(memory="4g", pids=1024))
    test_timeout_s: float = Field(1800.0, gt=0, description="the test command's limit (SWE-bench's default)")
    apply_timeout_s: float = Field(120.0, gt=0)
    job: str = "grade"


class GradeResult(BaseModel):
    """A graded patch. `log` is the raw host-framed log (store it: `regrade` needs only it and the patch)."""

    status: Status
    grader: str
    grader_version: str
    log: str = ""
    tests: dict[str, str] = Field(default_factory=dict)
    fail_to_pass: dict = Field(default_factory=dict)
    pass_to_pass: dict = Field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


def grader_of(task) -> tuple[str, str]:
    if task.kind == "r2e":
        return R2E_GRADER, R2E_GRADER_VERSION
    return SWEBENCH_GRADER, f"swebench=={package_version('swebench')}"


def patch_files(patch: str) -> list[str]:
    """Paths touched by a unified git diff (the `b/` side; the `a/` side for deletions)."""
    files: list[str] = []
    for match in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        path = match.group(2)
        if path not in files:
            files.append(path)
    return files


# --------------------------------------------------------------------------------------------- running


def _test_command(task, test_files: list[str]) -> str:
    if task.kind == "r2e":
        # R2E images keep tests at /r2e_tests and run them from /testbed via run_tests.sh
        return (
            "[ -e /testbed/r2e_tests ] || ln -s /r2e_tests /testbed/r2e_tests; "
            "if [ -f /testbed/run_tests.sh ]; then bash /testbed/run_tests.sh; else bash /root/run_tests.sh; fi"
        )
    if task.kind == "local" or not test_files:
        return task.test_cmd
    return f"{task.test_cmd} {' '.join(shlex.quote(f) for f in test_files)}"


_APPLY_MODEL = f"""set -u
cd /testbed
try() {{ echo "+ $*"; "$@" && exit 0; git reset -q --hard HEAD; git clean -fdq; }}
try git apply --verbose {WORK}/model.patch
try git apply --verbose --3way {WORK}/model.patch
try patch --batch --forward --fuzz=5 -p1 -i {WORK}/model.patch
echo "model patch did not apply"
exit 1
"""


def _reset_and_apply_tests(test_files: list[str]) -> str:
    """Restore every file the test patch touches to HEAD (or remove it), then apply the test patch."""
    lines = ["set -u", "cd /testbed"]
    for path in test_files:
        q = shlex.quote(path)
        lines.append(f"if git cat-file -e HEAD:{q} 2>/dev/null; then git checkout -q HEAD -- {q}; else rm -rf {q}; fi")
    lines.append(f"git apply --verbose {WORK}/test.patch")
    return "\n".join(lines) + "\n"


def grade(task, patch: str, *, config: GradeConfig | None = None) -> GradeResult:
    """Grade `patch` for `task` in a fresh container; every failure becomes a status with a reason."""
    grader, grader_version = grader_of(task)
    if not patch or not patch.strip():
        return GradeResult(
            status="empty_patch", grader=grader, grader_version=grader_version, error="the patch is empty"
        )
    started = time.monotonic()
    result = regrade(task, _run_in_fresh_container(task, patch, config or GradeConfig()), patch)
    result.seconds = time.monotonic() - started
    return result


def grade_base_state(task, *, config: GradeConfig | None = None) -> GradeResult:
    """Run the hidden tests on the untouched base state (task validation: F2P must fail, P2P pass)."""
    started = time.monotonic()
    result = _evaluate(task, _run_in_fresh_container(task, None, config or GradeConfig()))
    result.seconds = time.monotonic() - started
    return result


def _run_in_fresh_container(task, patch: str | None, config: GradeConfig) -> str:
    """Apply `patch` (None: leave the base state), then the test patch, run the tests; return the log."""
    from env.images import ImageError, ensure_task_image

    grader, _ = grader_of(task)
    token = secrets.token_hex(16)
    log = [f"{LOG_HEADER} token={token} task={task.instance_id} grader={grader}"]

    def section(box: Sandbox, name: str, cmd: str, timeout: float) -> bool:
        log.append(f"{token} BEGIN {name}")
        result = box.run(cmd, timeout=timeout, workdir="/testbed")
        log.append(result.output.rstrip("\n"))
        log.append(f"{token} END {name} rc={result.exit_code} timed_out={int(result.timed_out)}")
        return result.exit_code == 0 and not result.timed_out

    try:
        image = ensure_task_image(task)
        with Sandbox.start(
            image,
            config=config.sandbox,
            job=config.job,
            episode=f"grade-{task.instance_id}",
            labels={"nexus-eval.role": "grade"},
        ) as box:
            if patch is None:
                ok = section(box, "model_patch", "echo 'no model patch: grading the base state'", 30)
            else:
                box.write_file(f"{WORK}/model.patch", patch)
                ok = section(box, "model_patch", _APPLY_MODEL, config.apply_timeout_s)
            test_files = patch_files(task.test_patch or "")
            if ok and (task.test_patch or "").strip():
                box.write_file(f"{WORK}/test.patch", task.test_patch)
                ok = section(box, "test_patch", _reset_and_apply_tests(test_files), config.apply_timeout_s)
            if ok:
                section(box, "tests", _test_command(task, test_files), config.test_timeout_s)
    except (ImageError, SandboxError) as exc:
        log.append(f"{token} INFRA {type(exc).__name__}: {exc}")
    return "\n".join(log) + "\n"


# --------------------------------------------------------------------------------------------- regrading


def _sections(log: str, token: str) -> dict[str, tuple[str, int, bool]]:
    """name -> (body, rc, timed_out) for the LAST complete BEGIN/END frame of each name."""
    found: dict[str, tuple[str, int, bool]] = {}
    pattern = re.compile(rf"^{token} BEGIN (\w+)\n(.*?)^{token} END \1 rc=(-?\d+) timed_out=([01])$", flags=re.M | re.S)
    for match in pattern.finditer(log):
        found[match.group(1)] = (match.group(2), int(match.group(3)), match.group(4) == "1")
    return found


def regrade(task, log: str, patch: str) -> GradeResult:
    """Re-derive the status from a stored grading log (no container, no Docker needed)."""
    if not patch or not patch.strip():
        grader, grader_version = grader_of(task)
        return GradeResult(
            status="empty_patch", grader=grader, grader_version=grader_version, log=log, error="the patch is empty"
        )
    return _evaluate(task, log)


def _evaluate(task, log: str) -> GradeResult:
    """The status a host-framed log supports (sections read from their last frame)."""
    grader, grader_version = grader_of(task)
    base = {"grader": grader, "grader_version": grader_version, "log": log}
    header = re.match(rf"^{re.escape(LOG_HEADER)} token=([0-9a-f]{{32}}) ", log)
    if not header:
        return GradeResult(status="infra_failure", error="not a nexus-eval grading log (no header line)", **base)
    token = header.group(1)
    infra = re.findall(rf"^{token} INFRA (.*)$", log, flags=re.M)
    if infra:
        return GradeResult(status="infra_failure", error=infra[-1], **base)
    parts = _sections(log, token)
    if "model_patch" not in parts:
        return GradeResult(status="infra_failure", error="log has no model_patch section", **base)
    body, rc, timed_out = parts["model_patch"]
    if rc != 0 or timed_out:
        return GradeResult(status="patch_failed", error=f"the patch did not apply: {body[-500:]}", **base)
    if (task.test_patch or "").strip():
        if "test_patch" not in parts:
            return GradeResult(status="infra_failure", error="log has no test_patch section", **base)
        body, rc, timed_out = parts["test_patch"]
        if rc != 0 or timed_out:
            return GradeResult(
                status="infra_failure", error=f"the task's test patch did not apply: {body[-500:]}", **base
            )
    if "tests" not in parts:
        return GradeResult(status="infra_failure", error="log has no tests section", **base)
    body, rc, timed_out = parts["tests"]
    if timed_out:
        return GradeResult(status="timeout", error="the test command timed out", **base)
    if grader == R2E_GRADER:
        return _grade_r2e(task, body, base)
    return _grade_swebench(task, body, rc, base)


def _grade_swebench(task, test_output: str, exit_code: int, base: dict) -> GradeResult:
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE, ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status
    from swebench.harness.utils import make_test_spec

    spec = make_test_spec(
        {
            "instance_id": task.instance_id,
            "image": task.docker_image or "local",
            "repo": task.repo,
            "version": task.version or "0",
            "FAIL_TO_PASS": list(task.FAIL_TO_PASS),
            "PASS_TO_PASS": list(task.PASS_TO_PASS),
            "eval_type": "pass_and_fail",
            "log_parser": REPO_LOG_PARSERS.get(task.repo, DEFAULT_LOG_PARSER),
            "eval_script": f"#!/bin/bash\n: '{START_TEST_OUTPUT}'\ntrue\n: '{END_TEST_OUTPUT}'\n",
        }
    )
    # swebench reads the first markers and refuses logs with its bad-code markers: neutralise any that the
    # tested code printed, so only our host-framed region and exit code are what it sees.
    region = test_output.replace(">>>>>", "> > > > >")
    text = f"{START_TEST_OUTPUT}\n{region}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {exit_code}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as handle:
        handle.write(text)
        log_path = handle.name
    try:
        status_map, found = get_logs_eval(spec, log_path)
    finally:
        Path(log_path).unlink(missing_ok=True)
    if not found:
        return GradeResult(
            status="unresolved",
            error=f"swebench found no trustworthy test results in the log (test command exit code {exit_code})",
            **base,
        )
    report = get_eval_tests_report(
        status_map, {"FAIL_TO_PASS": list(task.FAIL_TO_PASS), "PASS_TO_PASS": list(task.PASS_TO_PASS)}
    )
    resolved = get_resolution_status(report) == ResolvedStatus.FULL.value
    return GradeResult(
        status="resolved" if resolved else "unresolved",
        tests=status_map,
        fail_to_pass=report["FAIL_TO_PASS"],
        pass_to_pass=report["PASS_TO_PASS"],
        **base,
    )


def parse_r2e_pytest(log: str) -> dict[str, str]:
    """R2E-Gym's pytest parsing: summary lines after "short test summary info" -> {Class.test: status}."""
    if "short test summary info" not in log:
        return {}
    statuses: dict[str, str] = {}
    for line in log.split("short test summary info", 1)[1].strip().split("\n"):
        status = next((s for s in ("PASSED", "FAILED", "ERROR") if s in line), None)
        if status is None:
            continue
        name = ".".join(line.split("::")[1:])
        if status != "PASSED":
            name = name.split(" - ")[0]
        statuses[_ANSI.sub("", name).split(" - ")[0]] = status
    return statuses


def _grade_r2e(task, test_output: str, base: dict) -> GradeResult:
    try:
        expected_raw = json.loads(task.expected_output_json or "")
    except json.JSONDecodeError as exc:
        return GradeResult(status="infra_failure", error=f"expected_output_json is not JSON: {exc}", **base)
    expected = {_ANSI.sub("", k).split(" - ")[0]: v for k, v in expected_raw.items()}
    parsed = parse_r2e_pytest(test_output)
    differing = sorted(k for k in expected.keys() | parsed.keys() if expected.get(k) != parsed.get(k))
    error = (
        None if not differing else f"{len(differing)} test keys differ from expected_output_json, e.g. {differing[:5]}"
    )
    return GradeResult(status="resolved" if not differing else "unresolved", tests=parsed, error=error, **base)


def export_patch_filtered(patch: str, str_replace_paths: Iterable[str], repo_root: str = "/testbed") -> str:
    """R2E-Gym's `true_output_patch`: keep only `.py` files edited with file_editor str_replace.

    If the agent never used str_replace, every `.py` file of the diff is kept (as R2E-Gym does).
    """
    root = repo_root.rstrip("/") + "/"
    edited = {p[len(root) :] if p.startswith(root) else p.lstrip("/") for p in str_replace_paths}
    chunks = re.split(r"(?m)^(?=diff --git )", patch)
    kept = []
    for chunk in chunks:
        match = re.match(r"diff --git a/(\S+) b/(\S+)", chunk)
        if not match or not match.group(2).endswith(".py"):
            continue
        if edited and match.group(2) not in edited:
            continue
        kept.append(chunk)
    return "".join(kept)
