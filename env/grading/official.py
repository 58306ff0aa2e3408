"""SWE-bench's own grading, run by us: swebench builds the spec and judges the log; we only run the script.

* The spec: `swebench.harness.utils.make_test_spec` (5.x) on the row. A 5.x row carries `eval_script`,
  `log_parser`, `eval_type`, `image`; a classic row gets them from swebench 4.1.0's `make_test_spec`
  (`env.tasks.swebench_legacy`, the same as `nexus-eval tasks convert`); a local task gets an eval script of the
  same shape written here (reset the test files, apply the test patch, markers around its `test_cmd`).
* The run (`run_eval`): the model patch goes through swebench's own apply chain (`GIT_APPLY_CMDS`, the tree
  reset between attempts, then the already-applied check), the eval script is written to `/eval.sh` and run
  with `/bin/bash` under the timeout (swebench's 1800 s by default), its merged output going to a file that
  is read back keeping its first 1 MiB and last 7 MiB (`Sandbox.run_to_file`): the test results, the end
  marker and the exit-code line are at the end. The environment is the harness's (`SANDBOX`,
  `APPLY_WORKDIR`): the image's own ENV with PATH untouched, as root, the apply commands in /testbed and the
  eval script in the image's WORKDIR.
* The verdict (`verdict`): swebench's `get_eval_report` on that log. On top, our anti-spoof veto: the
  genuine script prints each test-output marker once; a log where the tested code printed a start or end
  marker, or a second exit-code line, is not trusted (swebench reads the first markers it finds).
"""

from __future__ import annotations

import shlex
import tempfile
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from env.grading.hostlog import HostLog, Section
from env.sandbox.config import IMAGE_ENV
from env.sandbox.container import Sandbox

# swebench 5.0.2's harness (run_evaluation.create_container / run_instance) creates the container with
# user=CONTAINER_USER ("root", swebench.image_builder.constants) and no environment or working directory of
# its own, so every exec sees the image's ENV, PATH included (an image may put its toolchain there), and
# runs as root whatever the image's USER. The apply commands run with workdir=CONTAINER_WORKDIR
# ("/testbed"); `/bin/bash /eval.sh` gets no workdir: the container's, i.e. the image's WORKDIR.
# (tests/env/grading/test_grading_image_env.py checks these values against the installed swebench.)
SANDBOX = {"path": IMAGE_ENV, "user": "root"}
APPLY_WORKDIR = "/testbed"
PATCH_PATH = "/tmp/patch.diff"
EVAL_PATH = "/eval.sh"
LOCAL_HEREDOC = "EOF_NEXUS_EVAL_TEST_PATCH"


def grader_version(task) -> str:
    tool = f"swebench=={package_version('swebench')}"
    converted = getattr(task, "converted_by", None)
    if not converted and getattr(task, "kind", "local") != "local" and not getattr(task, "eval_script", None):
        from env.tasks.swebench_legacy import CONVERT_VERSION

        converted = f"swebench=={CONVERT_VERSION}"  # a classic row: spec_row converts it at grading time
    return f"{tool}; spec from {converted}" if converted else tool


def patch_files(patch: str) -> list[str]:
    """Paths touched by a unified git diff (the `b/` side)."""
    import re

    files: list[str] = []
    for match in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        if match.group(2) not in files:
            files.append(match.group(2))
    return files


def local_eval_script(task) -> str:
    """The eval script of a local task, in the shape of swebench's: reset, test patch, markers, reset."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    files = patch_files(task.test_patch)
    if LOCAL_HEREDOC in task.test_patch:
        raise ValueError(f"{task.instance_id}: the test patch contains the heredoc delimiter {LOCAL_HEREDOC}")
    quoted = " ".join(shlex.quote(f) for f in files)
    reset = [
        f'for f in {quoted}; do if git cat-file -e HEAD:"$f" 2>/dev/null; then git checkout HEAD -- "$f"; '
        'else rm -rf "$f"; fi; done'
    ]
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        "cd /testbed",
        *reset,
        f"git apply -v - <<'{LOCAL_HEREDOC}'",
        task.test_patch.rstrip("\n"),
        LOCAL_HEREDOC,
        f": '{START_TEST_OUTPUT}'",
        task.test_cmd,  # a local task's test_cmd runs its whole suite: PASS_TO_PASS spans every test file
        f": '{END_TEST_OUTPUT}'",
        *reset,
    ]
    return "\n".join(lines) + "\n"


def spec_row(task, image: str) -> dict[str, Any]:
    """The 5.x row swebench's `make_test_spec` takes for this task (converting a classic row if needed)."""
    row = {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "version": task.version or "0",
        "FAIL_TO_PASS": list(task.FAIL_TO_PASS),
        "PASS_TO_PASS": list(task.PASS_TO_PASS),
        "image": image,
        "image_assets": task.image_assets,
    }
    if task.kind == "local":
        return {
            **row,
            "eval_script": local_eval_script(task),
            "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail",
        }
    if task.has_swebench_metadata:
        return {**row, "eval_script": task.eval_script, "log_parser": task.log_parser, "eval_type": task.eval_type}
    from env.tasks.swebench_legacy import convert_classic_rows

    result = convert_classic_rows([dict(task.source_row)])
    if result.errors:
        raise ValueError(f"swebench 4.1.0 cannot build an eval script for {task.instance_id}: {result.errors[0]}")
    converted = result.rows[0]
    return {**row, **{k: converted[k] for k in ("eval_script", "log_parser", "eval_type")}}


def make_spec(row: dict[str, Any]):
    from swebench.harness.utils import make_test_spec

    return make_test_spec(row)


def apply_chain(
    box: Sandbox, commands, reset: str, log: HostLog, *, timeout_s: float, workdir: str = APPLY_WORKDIR
) -> bool:
    """Try each apply command on `PATCH_PATH` in turn in `workdir`, running `reset` before every retry; each
    attempt is a log section `apply.N`. True once one succeeds."""
    for attempt, command in enumerate(commands):
        if attempt:
            box.run(reset, timeout=timeout_s, workdir=workdir)
        applied = f"{command} {PATCH_PATH}"
        if log.record(f"apply.{attempt}", box.run(applied, timeout=timeout_s, workdir=workdir), command=applied):
            return True
    return False


def run_eval(box: Sandbox, spec, patch: str | None, log: HostLog, *, timeout_s: float, apply_timeout_s: float) -> bool:
    """Apply `patch` (None: grade the base state) as swebench does, then run the eval script. Returns False
    when the patch did not apply (the log says why)."""
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    if patch is not None:
        box.write_file(PATCH_PATH, patch)
        applied = apply_chain(box, GIT_APPLY_CMDS, "git checkout -- . ; git clean -fd", log, timeout_s=apply_timeout_s)
        if not applied:  # the chain can leave the patch applied while each command exited non-zero
            check = f"git apply --check --reverse {PATCH_PATH}"
            applied = log.record("apply.reverse_check", box.run(check, timeout=apply_timeout_s, workdir=APPLY_WORKDIR))
        if not applied:
            return False
    box.write_file(EVAL_PATH, spec.eval_script)
    # workdir None: the image's WORKDIR, where the harness's exec of the eval script starts
    log.record("eval", box.run_to_file(f"/bin/bash {EVAL_PATH}", timeout=timeout_s, workdir=None))
    return True


def spoof_veto(test_output: str, spec) -> str | None:
    """Why the log cannot be trusted, or None. The genuine script prints its start and end markers once
    each (as `set -x` trace lines) and at most one exit-code line; more means the tested code printed some."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE

    lines = test_output.splitlines()
    expected_exit_lines = int(any(TEST_EXIT_CODE in line for line in spec.eval_script_list))
    counts = {
        "start marker": (sum(START_TEST_OUTPUT in line for line in lines), 1),
        "end marker": (sum(END_TEST_OUTPUT in line for line in lines), 1),
        "exit-code line": (sum(line.startswith(TEST_EXIT_CODE) for line in lines), expected_exit_lines),
    }
    forged = [f"{name} x{seen} (expected {want})" for name, (seen, want) in counts.items() if seen > want]
    return f"the tested code printed grading markers: {', '.join(forged)}" if forged else None


def verdict(spec, eval_section: Section, patch: str | None) -> dict[str, Any]:
    """swebench's report on the eval log, plus the veto: {resolved, report, tests, vetoed, found}."""
    from swebench.harness.grading import get_eval_report, get_logs_eval

    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False, encoding="utf-8") as handle:
        handle.write(eval_section.body)
        path = handle.name
    try:
        prediction = {"instance_id": spec.instance_id, "model_name_or_path": "nexus-eval", "model_patch": patch or ""}
        report = get_eval_report(spec, prediction, path, include_tests_status=True)[spec.instance_id]
        tests, found = get_logs_eval(spec, path)
    finally:
        Path(path).unlink(missing_ok=True)
    vetoed = spoof_veto(eval_section.body, spec)
    return {
        "resolved": bool(report["resolved"]) and vetoed is None,
        "report": report,
        "tests": tests if found else {},
        "found": found,
        "vetoed": vetoed,
    }
