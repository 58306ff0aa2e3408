"""The half of `env.tasks.swebench_legacy` that runs INSIDE a legacy swebench venv (3.0.2 or 4.1.0).

It never runs in the project's environment (that one has swebench 5.x) and imports nothing of ours:
`env.tasks.swebench_legacy` starts it as `<venv>/bin/python -I swebench_legacy_worker.py` and writes one JSON request
on stdin:

    {"task": "convert" | "verdict", "expect": "4.1.0", "namespace": ..., "arch": ..., "items": [...]}

`convert` items are classic rows; `verdict` items are `{"row": ..., "log": ...}`. The answer is one JSON line
on stdout per item, in order, as soon as it is ready: `{"index": i, "ok": {...}}` or `{"index": i, "error": "..."}`
(a bad item never stops the others); anything swebench prints goes to stderr. A broken request exits with 2.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version as installed_version

REQUIRED = ("instance_id", "repo", "version", "base_commit", "test_patch")


def _test_spec(row: dict, **kwargs):
    """swebench's own `make_test_spec(row, **kwargs)`, minus the environment-image script.

    That script is the only part of a TestSpec that may reach the network (for many repos it downloads
    requirements files from GitHub at `environment_setup_commit`); the eval script, the image names and the
    grading data do not depend on it, so it is built as an empty list.
    """
    from swebench.harness.test_spec import test_spec as spec_module

    spec_module.make_env_script_list = lambda instance, specs, env_name: []
    return spec_module.make_test_spec(row, **kwargs)


def _known(row: dict) -> str | None:
    """Why this swebench cannot handle the row's repo/version, or None if it can."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    missing = [key for key in REQUIRED if not isinstance(row.get(key), str)]
    if missing:
        return f"missing or non-string field(s): {', '.join(missing)}"
    repo, ver = row.get("repo"), row.get("version")
    if repo not in MAP_REPO_VERSION_TO_SPECS:
        return f"swebench {installed_version('swebench')} does not know the repo {repo!r}"
    if ver not in MAP_REPO_VERSION_TO_SPECS[repo]:
        known = ", ".join(sorted(map(str, MAP_REPO_VERSION_TO_SPECS[repo])))
        return f"swebench {installed_version('swebench')} has no version {ver!r} of {repo} (it has: {known})"
    return None


def _eval_type(spec) -> str:
    """The evaluation type as a string: 3.x has `get_eval_type`; 4.1.0 decides it inside `get_eval_report`,
    from the same rule (repos in FAIL_ONLY_REPOS grade fail-only)."""
    try:
        from swebench.harness.log_parsers import get_eval_type
    except ImportError:
        from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType

        kind = EvalType.FAIL_ONLY if spec.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL
    else:
        kind = get_eval_type(spec)
    return getattr(kind, "value", kind)


def convert(row: dict, namespace: str | None, arch: str) -> dict:
    """The four fields a swebench 5.x row needs, as this swebench computes them for a classic row."""
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    spec = _test_spec(row, namespace=namespace, arch=arch)
    return {
        "eval_script": spec.eval_script,
        "log_parser": MAP_REPO_TO_PARSER[spec.repo].__name__,
        "eval_type": _eval_type(spec),
        "image": spec.instance_image_key,
    }


def verdict(row: dict, log: str) -> dict:
    """R2E-Gym's in-loop SWE-bench reward for one test log (its runtime reads swebench 3.0.2):

    1. any "bad" marker (patch apply failed, reset failed, tests errored, tests timed out) makes the log
       unusable: nothing is parsed (the start/end markers are NOT required);
    2. otherwise only the text after the last occurrence of the repo/version's test command (the last one if
       the spec lists several) is parsed, with the repo's parser from MAP_REPO_TO_PARSER;
    3. the F2P/P2P report is built from that status map (an empty one for an unusable log), and the row is
       resolved iff the resolution status is RESOLVED_FULL.
    """
    from swebench.harness.constants import (
        APPLY_PATCH_FAIL,
        FAIL_TO_PASS,
        KEY_INSTANCE_ID,
        MAP_REPO_VERSION_TO_SPECS,
        PASS_TO_PASS,
        RESET_FAILED,
        TESTS_ERROR,
        TESTS_TIMEOUT,
        ResolvedStatus,
    )
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER, get_eval_type

    spec = _test_spec(row)
    markers = [m for m in (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT) if m in log]
    status_map: dict = {}
    if not markers:
        command = MAP_REPO_VERSION_TO_SPECS[spec.repo][spec.version]["test_cmd"]
        if isinstance(command, list):
            command = command[-1]
        tail = log.rpartition(command)[2]  # the whole log when the command never appears
        status_map = MAP_REPO_TO_PARSER[spec.repo](tail, spec)
    expected = {
        KEY_INSTANCE_ID: spec.instance_id,
        FAIL_TO_PASS: spec.FAIL_TO_PASS,
        PASS_TO_PASS: spec.PASS_TO_PASS,
    }
    # the enum itself: get_eval_tests_report compares it with EvalType members
    report = get_eval_tests_report(status_map, expected, eval_type=get_eval_type(spec))
    return {
        "found": not markers,
        "bad_markers": markers,
        "status_map": status_map,
        "report": report,
        "resolved": get_resolution_status(report) == ResolvedStatus.FULL.value,
    }


def main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever swebench prints must not reach the JSON stream
    try:
        request = json.loads(sys.stdin.read())
        task, items = request["task"], request["items"]
    except (ValueError, KeyError, TypeError) as exc:
        print(f"bad request: {exc!r}", file=sys.stderr)
        return 2
    have = installed_version("swebench")
    if request.get("expect") and have != request["expect"]:
        print(f"this venv has swebench {have}, the request wants {request['expect']}", file=sys.stderr)
        return 2
    for index, item in enumerate(items):
        row = item if task == "convert" else item.get("row", {})
        answer: dict = {"index": index}
        try:
            reason = _known(row)
            if reason is not None:
                answer["error"] = reason
            elif task == "convert":
                answer["ok"] = convert(row, request.get("namespace"), request.get("arch", "x86_64"))
            elif task == "verdict":
                answer["ok"] = verdict(row, item.get("log", ""))
            else:
                answer["error"] = f"unknown task {task!r}"
        except Exception as exc:  # one bad row is reported and the batch goes on
            answer["error"] = f"{type(exc).__name__}: {exc}"
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
