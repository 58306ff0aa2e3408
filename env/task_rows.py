"""The `Task` model and how one dataset row becomes a Task (SWE-bench classic and 5.x, R2E-Gym's SWE-bench
republication, R2E-native). Loading files, folders and datasets is `env.tasks`.

A Task keeps what its row carries: the fields grading needs are typed (`eval_script`, `log_parser`,
`eval_type`, `image_assets` for SWE-bench 5.x rows; `expected_output_json` for R2E rows), and the whole row
stays in `source_row`, so nothing a later grader or report needs is lost at load time.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

TaskKind = Literal["swebench", "r2e_swebench", "r2e", "local"]

DEFAULT_TEST_CMD = "python -m pytest -rA"
REPO_DIR = "repo"
R2E_SWEBENCH_IMAGE = re.compile(r"^slimshetty/swebench-[a-z]+:sweb\.eval\.")
# R2E-Gym shows the agent only the text between the first [ISSUE] and the last [/ISSUE] (greedy, any lines).
R2E_ISSUE_TAGS = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.DOTALL)
# Repositories whose tests reach out to the internet (requests' tests call httpbin.org); a row may say
# otherwise with its own `needs_network`.
NETWORK_REPOS = frozenset({"psf/requests"})


class TaskError(ValueError):
    """Bad task input. `source` is the file (and row) it came from, `field` the offending field (or None)."""

    def __init__(self, source: str | Path, message: str, *, field: str | None = None) -> None:
        self.source = str(source)
        self.field = field
        where = f"{self.source}: field '{field}'" if field else self.source
        super().__init__(f"{where}: {message}")


class GradingLimits(BaseModel):
    """A task's own grading limits; unset fields take the grader's defaults (see docs/tasks.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float | None = Field(None, gt=0, description="the test run's limit")
    memory: str | None = Field(None, description="docker memory limit, e.g. '8g'")
    cpus: float | None = Field(None, gt=0)
    pids: int | None = Field(None, ge=16)
    network: bool | None = Field(None, description="give the grading container a network")


class Task(BaseModel):
    """One task an agent is evaluated on. Test ids are spelled as the task's log parser reports them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str
    repo: str
    base_commit: str | None = None
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    version: str | None = None
    docker_image: str | None = None
    test_cmd: str = DEFAULT_TEST_CMD
    setup: list[str] = []
    expected_output_json: str | None = None
    kind: TaskKind
    local_dir: Path | None = None
    # SWE-bench 5.x grading metadata (absent on classic rows until `nexus-eval tasks convert` adds it)
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: str | None = None
    image_assets: dict[str, Any] | None = None
    converted_by: str | None = None
    environment_setup_commit: str | None = None
    needs_network: bool = False
    grading: GradingLimits = GradingLimits()
    source_row: dict[str, Any] = Field(default_factory=dict, repr=False)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_list(cls, value: Any) -> Any:
        # SWE-bench stores both lists as JSON-encoded strings; parquet/HF can hand us tuples or arrays.
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON-encoded list: {exc}") from None
        if not isinstance(value, list | tuple) and hasattr(value, "tolist"):
            value = value.tolist()
        if not isinstance(value, list | tuple):
            raise ValueError(f"must be a list of test ids, got {type(value).__name__}")
        return list(value)

    @field_validator("image_assets", mode="before")
    @classmethod
    def _decode_assets(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else None
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        return value or None

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value: Any) -> Any:
        # Some dumps store "3.0" as a float; keep the text form the harness keys on.
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("instance_id", "repo")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @property
    def repo_dir(self) -> Path | None:
        """Local tasks: the source tree at the base state (`<local_dir>/repo`)."""
        return self.local_dir / REPO_DIR if self.local_dir is not None else None

    @property
    def has_swebench_metadata(self) -> bool:
        """True when swebench 5.x can build this row's test spec as it is (no conversion needed)."""
        return bool(self.eval_script and self.log_parser and self.eval_type)


def validate_fields(source: str, fields: dict[str, Any]) -> Task:
    """Build a Task, turning pydantic's error into a TaskError that names the source and the field."""
    try:
        return Task(**fields)
    except ValidationError as exc:
        errors = exc.errors()
        locs = [".".join(str(p) for p in e["loc"]) for e in errors]
        messages = [e["msg"].removeprefix("Value error, ") + f" (got {e['input']!r:.80})" for e in errors]
        also = "".join(f"; also field '{loc}': {msg}" for loc, msg in zip(locs[1:], messages[1:], strict=True))
        raise TaskError(source, messages[0] + also, field=locs[0] or None) from None


def row_kind(row: dict[str, Any]) -> TaskKind:
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


def _r2e_base_commit(row: dict[str, Any]) -> str | None:
    content = row.get("parsed_commit_content")
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except json.JSONDecodeError:
            return None
    return content.get("old_commit_hash") if isinstance(content, dict) else None


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
        "patch": row.get("patch") or "",
        "test_patch": row.get("test_patch") or "",
        "FAIL_TO_PASS": row.get("FAIL_TO_PASS") or [],
        "PASS_TO_PASS": row.get("PASS_TO_PASS") or [],
        "docker_image": row["docker_image"],
        "expected_output_json": expected,
    }


SWEBENCH_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
SWEBENCH_OPTIONAL = ("version", "eval_script", "log_parser", "eval_type", "image_assets", "converted_by")


def task_from_row(row: dict[str, Any], *, source: str = "<row>") -> Task:
    """Map one dataset row (SWE-bench classic or 5.x, R2E SWE-bench or R2E-native) onto a Task."""
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
    return validate_fields(source, {**fields, "kind": kind, "source_row": dict(row)})
