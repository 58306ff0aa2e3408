"""R2E-Gym's grading, the way its `runtime/docker.py` does it, in a fresh container of ours.

R2E-native images (`namanjain12/<repo>_final:<commit>`): the repo at /testbed with a uv venv at
/testbed/.venv, the hidden tests at /r2e_tests, the test script at /testbed/run_tests.sh. R2E-Gym moves
`run_tests.sh` to /root and `/r2e_tests` to /root/r2e_tests (linked back as /testbed/r2e_tests) and runs
`bash /root/run_tests.sh`; we do the same moves before the patch is applied, and the apply chain resets the
tree to its starting snapshot between attempts instead of `git clean`, so nothing of the image (its
untracked build files, the moved tests) can be cleaned away. The reward: the output with ANSI colour codes
and `\\r` removed, parsed like R2E's `parse_log_pytest` (the `-rA` summary), compared with
`expected_output_json`: both maps cut at " - ", the empty key skipped, equal size and equal statuses.

R2E's SWE-bench images (`slimshetty/swebench-verified:sweb.eval.x86_64.<id>`): `/run_tests.sh` baked in at
the root, run after `ln -s /opt/miniconda3/envs/testbed /root/.venv`; the verdict is R2E-Gym's in-loop one
(its copy of `get_logs_eval`, swebench 3.0.2's parser and report, RESOLVED_FULL), computed in a swebench
3.0.2 environment by `env.tasks.swebench_legacy.r2e_swebench_verdict`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from env.grading.hostlog import HostLog
from env.grading.official import PATCH_PATH, apply_chain
from env.sandbox.container import Sandbox

# R2E-Gym runs every command with its repo interpreter first (runtime/docker.py's DOCKER_PATH).
R2E_PATH = (
    "/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
# R2E-Gym's DockerRuntime starts the container with no user, environment or working directory of its own, and
# `run` execs with environment={"PATH": DOCKER_PATH} (added to the image's ENV) and workdir /testbed (its
# repo_path, also our `Sandbox.run` default): the image's USER, the image's ENV with that PATH.
SANDBOX = {"path": R2E_PATH, "user": None}
R2E_VERSION = "r2e-gym@69bc953 runtime/docker.py semantics"
_COLOUR_AND_CR = re.compile(r"\x1b\[[0-9;]*m|\r")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BASE_INDEX = "/tmp/.nexus-grade-base.index"

# R2E-Gym's setup of an R2E-native container, in its order (with its failures tolerated, as there).
NATIVE_SETUP = """
ln -s /testbed/.venv /root/.venv 2>/dev/null
mkdir -p /root/.local/bin
find /testbed -name '*.pyc' -delete; find /testbed -name '__pycache__' -exec rm -rf {} + 2>/dev/null
find /r2e_tests -name '*.pyc' -delete 2>/dev/null; find /r2e_tests -name '__pycache__' -exec rm -rf {} + 2>/dev/null
[ -e /testbed/run_tests.sh ] && mv /testbed/run_tests.sh /root/run_tests.sh
[ -e /testbed/r2e_tests ] && mv /testbed/r2e_tests /root/r2e_tests
[ -e /r2e_tests ] && mv /r2e_tests /root/r2e_tests
ln -s /root/r2e_tests /testbed/r2e_tests
true
"""
SWEBENCH_SETUP = "chmod +x /run_tests.sh; ln -s /opt/miniconda3/envs/testbed /root/.venv 2>/dev/null; true"

# Snapshot the starting tree in a private index, and go back to it without `git clean`.
_SNAPSHOT = f"rm -f {BASE_INDEX}; GIT_INDEX_FILE={BASE_INDEX} git add -A"
_RESTORE = (
    f"GIT_INDEX_FILE={BASE_INDEX} git ls-files -o --exclude-standard -z | xargs -0 -r rm -f; "
    f"GIT_INDEX_FILE={BASE_INDEX} git checkout-index -a -f"
)
APPLY_CMDS = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --forward --fuzz=5 -p1 -i")


def apply_keeping_the_tree(box: Sandbox, patch: str, log: HostLog, *, timeout_s: float) -> bool:
    """Apply `patch` with a fallback chain, restoring the starting snapshot (never `git clean`) in between."""
    box.write_file(PATCH_PATH, patch)
    log.record("snapshot", box.run(_SNAPSHOT, timeout=timeout_s))
    if apply_chain(box, APPLY_CMDS, _RESTORE, log, timeout_s=timeout_s):
        return True
    box.run(_RESTORE, timeout=timeout_s)
    return False


def run_native(box: Sandbox, patch: str | None, log: HostLog, *, timeout_s: float, apply_timeout_s: float) -> bool:
    log.record("setup", box.run(NATIVE_SETUP, timeout=apply_timeout_s))
    if patch is not None and not apply_keeping_the_tree(box, patch, log, timeout_s=apply_timeout_s):
        return False
    log.record("tests", box.run_to_file("bash /root/run_tests.sh", timeout=timeout_s))
    return True


def run_swebench_image(
    box: Sandbox, patch: str | None, log: HostLog, *, timeout_s: float, apply_timeout_s: float
) -> bool:
    if patch is not None and not apply_keeping_the_tree(box, patch, log, timeout_s=apply_timeout_s):
        return False
    log.record("setup", box.run(SWEBENCH_SETUP, timeout=apply_timeout_s, workdir="/testbed"))
    log.record("tests", box.run_to_file("/run_tests.sh", timeout=timeout_s))
    return True


def parse_r2e_pytest(log: str) -> dict[str, str]:
    """R2E-Gym's pytest parsing: summary lines after "short test summary info" -> {Class.test: status}.

    The key is the node id without its file part, joined with "."; FAILED/ERROR lines lose their " - reason";
    XFAIL, XPASS and SKIPPED lines are not statuses here.
    """
    if "short test summary info" not in log:
        return {}
    statuses: dict[str, str] = {}
    for line in log.split("short test summary info", 1)[1].strip().split("\n"):
        status = next((s for s in ("PASSED", "FAILED", "ERROR") if s in line), None)
        if status is None:
            continue
        name = ".".join(line.split("::")[1:])
        statuses[name if status == "PASSED" else name.split(" - ")[0]] = status
    return statuses


def _normalised(statuses: dict[str, str]) -> dict[str, str]:
    # ANSI out of the keys, the " - ..." suffix cut; the empty key (a summary line that named no test,
    # e.g. "ERROR r2e_tests/test_x.py - ImportError") has no counterpart in any expected map: skipped.
    out = {}
    for key in sorted(statuses):
        clean = _ANSI.sub("", key).split(" - ")[0]
        if clean:
            out[clean] = statuses[key]
    return out


def native_verdict(test_output: str, expected_output_json: str) -> dict[str, Any]:
    """R2E-Gym's reward on one test run: {resolved, tests, expected, differing}."""
    parsed = _normalised(parse_r2e_pytest(_COLOUR_AND_CR.sub("", test_output)))
    expected = _normalised(json.loads(expected_output_json))
    differing = sorted(k for k in parsed.keys() | expected.keys() if parsed.get(k) != expected.get(k))
    resolved = len(parsed) == len(expected) and all(expected.get(k) == v for k, v in parsed.items())
    return {"resolved": resolved, "tests": parsed, "expected": expected, "differing": differing}


def swebench_image_output(output: str, exit_code: int, timeout_s: float) -> str:
    """What R2E-Gym's `run` hands its parser: colour and \\r removed on exit 0 only, the raw text otherwise."""
    if exit_code == 0:
        return _COLOUR_AND_CR.sub("", output)
    if exit_code in (124, 137):
        return f"The command took too long to execute (>{int(timeout_s)}s)"
    return output


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
