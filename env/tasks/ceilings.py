"""The operator's ceilings on what a task row may ask of its grading container.

A task's `grading` block (`env.tasks.task_model.GradingLimits`) can raise the grading container's limits above the
grader's defaults (`grading.GradeConfig`). That container runs the patched code as root, so a row must
not be able to lift them without bound: every limit a row may set has a ceiling here, set by the operator.
`GradingCeilings()` holds the defaults (each at least the grader's own default and what the bundled suites
and tests set); a worker passes its own.

They are checked twice: when a task is loaded (`env.tasks.loading` loaders and
`env.tasks.dataset_rows.task_from_row` take `ceilings=`; a row over them is a `TaskError` naming the task, the
field, the value and the ceiling) and again when a task is graded (`GradeConfig.ceilings`; a task over them is an
`infra_failure` with the same message, nothing is run), for tasks built without a loader or loaded under other
ceilings.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# docker's memory syntax, as docker-py's parse_bytes reads it: a number, then b, k, m or g (x1024), then an
# optional "b" ("8g", "8gb", "512m", "1.5g"); a bare number is bytes.
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([bkmg]?)b?$", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
DOCKER_MIN_MEMORY = 6 * 1024**2  # the engine refuses a smaller memory limit


def parse_memory(value: str | int) -> int:
    """Bytes of a docker memory limit ("8g" -> 8 GiB). A ValueError for anything that is not a positive size:
    "0" (docker's "no limit"), "-1", "lots", "" (so a row can never ask for an unlimited container)."""
    text = str(value).strip()
    match = _MEMORY.match(text)
    if not match:
        raise ValueError(f"{value!r} is not a docker memory size (a number with b, k, m or g, e.g. '8g')")
    size = int(float(match.group(1)) * _UNIT[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{value!r} means no memory limit")
    if size < DOCKER_MIN_MEMORY:
        raise ValueError(f"{value!r} is below Docker's minimum of 6m")
    return size


class GradingCeilings(BaseModel):
    """The most a task's `grading` block may ask for (see the module docstring). Frozen; pass your own to the
    loaders (`ceilings=`) and to `GradeConfig(ceilings=...)`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: str = Field("16g", description="the largest memory limit a row may set (docker syntax)")
    pids: int = Field(4096, ge=16, description="the largest process limit a row may set")
    cpus: float = Field(16.0, gt=0, description="the largest CPU quota a row may set")
    timeout_s: float = Field(3 * 3600.0, gt=0, description="the longest test-run limit a row may set")
    allow_network: bool = Field(False, description="whether a row may ask for a network (`network: true`)")

    @field_validator("memory")
    @classmethod
    def _a_memory_size(cls, value: str) -> str:
        parse_memory(value)
        return value

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)


DEFAULT_CEILINGS = GradingCeilings()


class GradingLimitError(ValueError):
    """A task's `grading` block asks for more than the operator's ceilings allow."""

    def __init__(self, task_id: str, field: str, value: Any, ceiling: str, why: str) -> None:
        self.task_id, self.field, self.value, self.ceiling = task_id, field, value, ceiling
        super().__init__(f"task {task_id}: grading.{field} = {value!r} is refused: {why} (ceiling: {ceiling})")


def limit_problems(task_id: str, limits: Any, ceilings: GradingCeilings | None = None) -> list[GradingLimitError]:
    """Every way `limits` (a `GradingLimits`, or anything with its attributes) passes `ceilings`."""
    ceilings = ceilings or DEFAULT_CEILINGS
    problems: list[GradingLimitError] = []

    def refuse(field: str, value: Any, ceiling: str, why: str) -> None:
        problems.append(GradingLimitError(task_id, field, value, ceiling, why))

    memory = getattr(limits, "memory", None)
    if memory is not None:
        try:
            if parse_memory(memory) > ceilings.memory_bytes:
                refuse("memory", memory, f"memory={ceilings.memory}", "above the operator's ceiling")
        except ValueError as exc:
            refuse("memory", memory, f"memory={ceilings.memory}", str(exc))
    for field, ceiling in (("pids", ceilings.pids), ("cpus", ceilings.cpus), ("timeout_s", ceilings.timeout_s)):
        value = getattr(limits, field, None)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            refuse(field, value, f"{field}={ceiling:g}", "not a positive number")
        elif value > ceiling:
            refuse(field, value, f"{field}={ceiling:g}", "above the operator's ceiling")
    if getattr(limits, "network", None) and not ceilings.allow_network:
        refuse("network", True, "allow_network=False", "the operator does not let task rows turn the network on")
    return problems


def check_limits(task_id: str, limits: Any, ceilings: GradingCeilings | None = None) -> None:
    """Raise the first `GradingLimitError` of `limit_problems` (its message names the others' fields too)."""
    problems = limit_problems(task_id, limits, ceilings)
    if problems:
        first = problems[0]
        if len(problems) > 1:
            others = ", ".join(f"grading.{p.field}" for p in problems[1:])
            first.args = (f"{first.args[0]}; also over the ceilings: {others}",)
        raise first
