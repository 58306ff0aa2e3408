"""The `Task` model: one task an agent is evaluated on, whatever dataset row kind or folder it came from, and
`TaskError`, the error every loader raises for bad input (naming the source and the field).

A Task keeps what its row carries: the fields grading needs are typed (`eval_script`, `log_parser`,
`eval_type`, `image_assets` for SWE-bench 5.x rows; `expected_output_json` for R2E rows), and the whole row
stays in `source_row`, so nothing a later grader or report needs is lost at load time. Turning a row into
these fields is `env.tasks.dataset_rows`; reading files, folders and datasets is `env.tasks.loading`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from env.tasks.ceilings import GradingCeilings, GradingLimitError, check_limits

TaskKind = Literal["swebench", "r2e_swebench", "r2e", "local"]

DEFAULT_TEST_CMD = "python -m pytest -rA"
REPO_DIR = "repo"
TASK_FILE = "task.json"  # a local task folder: TASK_FILE and REPO_DIR/ (or a packed suite's bug patch)
# A setup line becomes one Dockerfile `RUN` line (env.tasks.images): a line break would start a new instruction
# (`ADD http://...`, fetched by the daemon outside the build's network_mode none, or a new `FROM`), so no
# control character but tab may appear in it, nor a trailing backslash (it would join the next line).
SETUP_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|\\\s*$")


def setup_problem(task_id: str, lines: list[str]) -> str | None:
    """Why `lines` cannot be `task_id`'s setup lines (each one Dockerfile RUN instruction), naming the first bad
    line; None when every line is fine."""
    for number, line in enumerate(lines, start=1):
        match = SETUP_FORBIDDEN.search(line)
        if match is None:
            continue
        if match.group(0).startswith("\\"):
            why = "ends with a backslash, which would join the next Dockerfile line to it"
        else:
            why = (
                f"holds the control character {match.group(0)!r} "
                "(a setup line must be a single line; only tab is allowed)"
            )
        return f"task {task_id}: setup line {number} {why}: {line!r:.120}"
    return None


class TaskError(ValueError):
    """Bad task input. `source` is the file (and row) it came from, `field` the offending field (or None)."""

    def __init__(self, source: str | Path, message: str, *, field: str | None = None) -> None:
        self.source = str(source)
        self.field = field
        where = f"{self.source}: field '{field}'" if field else self.source
        super().__init__(f"{where}: {message}")


class GradingLimits(BaseModel):
    """A task's own grading limits; unset fields take the grader's defaults (see docs/tasks.md). Each must stay
    within the operator's ceilings (`env.tasks.ceilings.GradingCeilings`), checked by the loaders and again
    when the task is graded."""

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

    @field_validator("setup")
    @classmethod
    def _single_lines(cls, value: list[str], info: ValidationInfo) -> list[str]:
        problem = setup_problem(info.data.get("instance_id", "?"), value)
        if problem:
            raise ValueError(problem)
        return value

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


def validate_fields(source: str, fields: dict[str, Any], *, ceilings: GradingCeilings | None = None) -> Task:
    """Build a Task, turning pydantic's error into a TaskError that names the source and the field; a `grading`
    block over the operator's `ceilings` (None: `env.tasks.ceilings.DEFAULT_CEILINGS`) is a TaskError too."""
    try:
        task = Task(**fields)
    except ValidationError as exc:
        errors = exc.errors()
        locs = [".".join(str(p) for p in e["loc"]) for e in errors]
        messages = [e["msg"].removeprefix("Value error, ") + f" (got {e['input']!r:.80})" for e in errors]
        also = "".join(f"; also field '{loc}': {msg}" for loc, msg in zip(locs[1:], messages[1:], strict=True))
        raise TaskError(source, messages[0] + also, field=locs[0] or None) from None
    try:
        check_limits(task.instance_id, task.grading, ceilings)
    except GradingLimitError as exc:  # the same message grading gives, located at the source
        raise TaskError(source, str(exc), field=f"grading.{exc.field}") from None
    return task
