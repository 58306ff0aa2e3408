"""Task validation: the gold patch must resolve a task, and the base state must fail every FAIL_TO_PASS test
while passing every PASS_TO_PASS test (so the lists in task.json are right). Both runs use the real grader
in fresh containers (`grading`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from env.grading import GradeConfig, GradeResult, grade, grade_base_state


class TaskValidation(BaseModel):
    """The verdict for one task; `problems` says exactly what is wrong when `valid` is false."""

    instance_id: str
    valid: bool
    gold_status: str
    base_status: str
    problems: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    grader: str = ""
    grader_version: str = ""


def _listed(report: dict, key: str) -> list[str]:
    return list(report.get(key, []) or [])


def _empty_gold_reason(task) -> str:
    """Why an R2E-native task's gold patch is empty (no `patch` in its row; env.tasks.r2e_gold_patch.r2e_gold_patch)."""
    if task.kind != "r2e":
        return ""
    if task.source_row.get("parsed_commit_content"):
        return "; the row has no `patch` and its `parsed_commit_content` changes no non-test Python file"
    return "; the row has neither a `patch` nor a `parsed_commit_content` to rebuild it from"


def judge(task, gold: GradeResult, base: GradeResult) -> list[str]:
    """What is wrong with a task given its gold-patch and base-state grading results (empty: valid)."""
    problems: list[str] = []
    if gold.status != "resolved":
        failing = _listed(gold.fail_to_pass, "failure") + _listed(gold.pass_to_pass, "failure")
        detail = f"; failing: {failing[:5]}" if failing else ""
        if gold.status == "empty_patch":
            detail += _empty_gold_reason(task)
        problems.append(f"gold patch -> {gold.status}{detail}{f' ({gold.error})' if gold.error else ''}")
    if base.status == "resolved":
        problems.append("the base state already resolves the task (FAIL_TO_PASS tests pass without a fix)")
    elif base.status != "unresolved":
        problems.append(f"base state -> {base.status}{f' ({base.error})' if base.error else ''}")
    else:
        passing_f2p = _listed(base.fail_to_pass, "success")
        failing_p2p = _listed(base.pass_to_pass, "failure")
        if passing_f2p:
            problems.append(f"FAIL_TO_PASS tests that already pass on the base state: {passing_f2p}")
        if failing_p2p:
            problems.append(f"PASS_TO_PASS tests that fail on the base state: {failing_p2p}")
        if task.kind != "r2e" and not base.fail_to_pass and not base.pass_to_pass:
            problems.append(f"base state: no test results ({base.error})")
    return problems


def validate_task(task, *, config: GradeConfig | None = None) -> TaskValidation:
    started = time.monotonic()
    gold = grade(task, task.patch, config=config)
    base = grade_base_state(task, config=config)
    problems = judge(task, gold, base)
    return TaskValidation(
        instance_id=task.instance_id,
        valid=not problems,
        gold_status=gold.status,
        base_status=base.status,
        problems=problems,
        seconds=time.monotonic() - started,
        grader=gold.grader,
        grader_version=gold.grader_version,
    )


def validate_tasks(
    tasks, *, config: GradeConfig | None = None, on_done: Callable[[TaskValidation], None] | None = None
) -> list[TaskValidation]:
    """Validate each task in turn; ``on_done`` sees each verdict as it is made (a progress bar)."""
    results = []
    for task in tasks:
        verdict = validate_task(task, config=config)
        results.append(verdict)
        if on_done:
            on_done(verdict)
    return results
