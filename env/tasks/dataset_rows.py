"""How one dataset row becomes a `Task` (`env.tasks.task_model`): SWE-bench classic and 5.x, R2E-Gym's
SWE-bench republication, R2E-native. Loading files, folders and datasets is `env.tasks.loading`.

An R2E-native row usually has no `patch`: its gold patch is rebuilt from `parsed_commit_content` (R2E-Gym's
record of the upstream commit) as R2E-Gym builds the agent's gold patch (`env.tasks.r2e_gold_patch`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from env.tasks.ceilings import GradingCeilings
from env.tasks.r2e_gold_patch import r2e_gold_patch
from env.tasks.task_model import Task, TaskError, TaskKind, validate_fields

R2E_SWEBENCH_IMAGE = re.compile(r"^slimshetty/swebench-[a-z]+:sweb\.eval\.")
# R2E-Gym shows the agent only the text between the first [ISSUE] and the last [/ISSUE] (greedy, any lines).
R2E_ISSUE_TAGS = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.DOTALL)
# Repositories whose tests reach out to the internet (requests' tests call httpbin.org); a row may say
# otherwise with its own `needs_network`.
NETWORK_REPOS = frozenset({"psf/requests"})
# the row field holding R2E-Gym's record of the upstream commit (see `env.tasks.r2e_gold_patch`)
R2E_COMMIT_FIELD = "parsed_commit_content"


def row_kind(row: dict[str, Any]) -> TaskKind:
    """Which kind of dataset row this is, from the fields only that kind carries (rows name no kind)."""
    # R2E-native rows: `repo_name` and the exact-match oracle, no SWE-bench base commit (and usually no id).
    if (
        row.get("repo_name")
        and not row.get("base_commit")
        and (not row.get("instance_id") or "expected_output_json" in row)
    ):
        return "r2e"
    image = row.get("docker_image") or ""
    if "parsed_commit" in row or R2E_SWEBENCH_IMAGE.match(image):
        return "r2e_swebench"
    return "swebench"


def r2e_instance_id(row: dict[str, Any]) -> str:
    """A stable id for an R2E-native row: `<repo_name>__<commit_hash[:12]>` (rLLM's spelling).

    Without `commit_hash` it falls back to the image tag (R2E tags images by commit), then to a hash of
    image + problem statement, so the id never changes between loads of the same row.
    """
    repo_name = str(row.get("repo_name") or "").strip()
    commit = str(row.get("commit_hash") or "").strip()
    image = str(row.get("docker_image") or "")
    tag = image.rsplit(":", 1)[1] if ":" in image else ""
    if not commit and tag and "/" not in tag:  # "registry:5000/name" has a port, not a tag
        commit = tag
    if not commit:
        seed = f"{image}\n{row.get('problem_statement') or ''}".encode()
        commit = hashlib.sha256(seed).hexdigest()
    return f"{repo_name}__{commit[:12]}"


def r2e_problem_statement(text: str) -> str:
    """What R2E-Gym shows the agent: the text inside `[ISSUE]...[/ISSUE]` when the tags are there."""
    match = R2E_ISSUE_TAGS.search(text)
    return match.group(1) if match else text


def _r2e_commit(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row's `parsed_commit_content` decoded, or None when it is absent or not a JSON object."""
    content = row.get(R2E_COMMIT_FIELD)
    if isinstance(content, str):
        try:
            content = json.loads(content) if content.strip() else None
        except json.JSONDecodeError:
            return None
    return content if isinstance(content, dict) else None


def _r2e_base_commit(row: dict[str, Any]) -> str | None:
    commit = _r2e_commit(row)
    return commit.get("old_commit_hash") if commit else None


def _r2e_patch(row: dict[str, Any], source: str) -> str:
    """The row's own `patch` when it has one; else the gold patch rebuilt from `parsed_commit_content`
    (an error naming the row and that field when it cannot be); else empty."""
    patch = row.get("patch") or ""
    content = row.get(R2E_COMMIT_FIELD)
    if patch.strip() or content is None or (isinstance(content, str) and not content.strip()):
        return patch
    try:
        return r2e_gold_patch(content)
    except ValueError as exc:
        raise TaskError(source, f"cannot rebuild the gold patch: {exc}", field=R2E_COMMIT_FIELD) from None


def _r2e_fields(row: dict[str, Any], source: str) -> dict[str, Any]:
    for key in ("repo_name", "docker_image", "problem_statement", "expected_output_json"):
        if not row.get(key):
            raise TaskError(source, "required for an R2E-native row", field=key)
    expected = row["expected_output_json"]
    if not isinstance(expected, str):
        expected = json.dumps(expected)
    try:
        decoded = json.loads(expected)
    except json.JSONDecodeError as exc:
        raise TaskError(source, f"not JSON: {exc}", field="expected_output_json") from None
    if not isinstance(decoded, dict) or not decoded:
        raise TaskError(source, "must be a non-empty JSON object of test -> status", field="expected_output_json")
    return {
        "instance_id": row.get("instance_id") or r2e_instance_id(row),
        "repo": row["repo_name"],
        "base_commit": _r2e_base_commit(row),
        "problem_statement": r2e_problem_statement(row["problem_statement"]),
        "patch": _r2e_patch(row, source),
        "test_patch": row.get("test_patch") or "",
        "FAIL_TO_PASS": row.get("FAIL_TO_PASS") or [],
        "PASS_TO_PASS": row.get("PASS_TO_PASS") or [],
        "docker_image": row["docker_image"],
        "expected_output_json": expected,
    }


SWEBENCH_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
SWEBENCH_OPTIONAL = ("version", "eval_script", "log_parser", "eval_type", "image_assets", "converted_by")


def task_from_row(row: dict[str, Any], *, source: str = "<row>", ceilings: GradingCeilings | None = None) -> Task:
    """Map one dataset row (SWE-bench classic or 5.x, R2E SWE-bench or R2E-native) onto a Task; its `grading`
    block must stay within `ceilings` (None: the default ceilings, `env.tasks.ceilings`)."""
    if not isinstance(row, dict):
        raise TaskError(source, f"a task row must be an object, got {type(row).__name__}")
    kind = row_kind(row)
    if kind == "r2e":
        fields = _r2e_fields(row, source)
    else:
        for key in (*SWEBENCH_REQUIRED, "FAIL_TO_PASS", "PASS_TO_PASS"):
            if key not in row or row[key] is None:
                raise TaskError(source, f"required for a {kind} row", field=key)
        fields = {key: row[key] for key in (*SWEBENCH_REQUIRED, "FAIL_TO_PASS", "PASS_TO_PASS")}
        fields.update({key: row[key] for key in SWEBENCH_OPTIONAL if row.get(key) is not None})
        fields["environment_setup_commit"] = row.get("environment_setup_commit") or None
        fields["docker_image"] = row.get("docker_image") or row.get("image") or None
        if kind == "r2e_swebench":
            fields["problem_statement"] = r2e_problem_statement(fields["problem_statement"])
    for key in ("test_cmd", "setup", "grading"):
        if row.get(key):
            fields[key] = row[key]
    fields["needs_network"] = bool(row.get("needs_network", fields["repo"] in NETWORK_REPOS))
    return validate_fields(source, {**fields, "kind": kind, "source_row": dict(row)}, ceilings=ceilings)
