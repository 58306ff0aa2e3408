"""Grading an episode's patch in a fresh container, and re-grading from a stored log.

Each task is graded by the tool its row belongs to (docs/tasks.md, "How a task is graded"):

* `swebench`: SWE-bench 5.x rows, classic rows (their spec from swebench 4.1.0), R2E's SWE-bench rows by
  default, local tasks. swebench's apply chain, then its eval script (`official`); the verdict is swebench's
  `get_eval_report` plus our marker veto.
* `r2e-swebench`: R2E's SWE-bench rows with `r2e_swebench_route="r2e"`. The image's `/run_tests.sh`
  (`r2e`); R2E-Gym's in-loop reward on swebench 3.0.2.
* `r2e-native`: R2E-native rows. R2E-Gym's moves, then `/root/run_tests.sh` (`r2e`); R2E-Gym's exact match
  with `expected_output_json`.

The grading container starts from the task's image with nothing of the agent's container but the patch;
the log is framed by the host (`hostlog`) and holds everything needed to re-derive the verdict
(`regrade`). Limits come from `GradeConfig`, then the task's own `grading` limits, which must stay within the
operator's `GradeConfig.ceilings` (`limits.GradingCeilings`; a task over them is an `infra_failure` and nothing
runs); the commands' environment (PATH and ENV, user, working directory) is the route's tool's own
(`official.SANDBOX`, `r2e.SANDBOX`). The test run's log is read back capped (`Sandbox.run_to_file`: its head
and a generous tail), and no file in the grading container can grow past `SandboxConfig.max_file_bytes`.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from env.grading import hostlog, official, r2e
from env.grading.hostlog import LOG_HEADER
from env.grading.official import patch_files
from env.grading.r2e import export_patch_filtered, parse_r2e_pytest
from env.sandbox.config import WORKER_LABEL, SandboxConfig, SandboxError
from env.sandbox.container import Sandbox
from env.sandbox.output import FILE_OUTPUT_HEAD_BYTES, FILE_OUTPUT_TAIL_BYTES
from env.tasks.ceilings import DEFAULT_CEILINGS, GradingCeilings, GradingLimitError, check_limits

__all__ = [
    "LOG_HEADER",
    "DEFAULT_CEILINGS",
    "GradeConfig",
    "GradeResult",
    "GradingCeilings",
    "GradingLimitError",
    "Status",
    "export_patch_filtered",
    "grade",
    "grade_base_state",
    "grader_of",
    "parse_r2e_pytest",
    "patch_files",
    "regrade",
    "route_of",
]

Status = Literal["resolved", "unresolved", "empty_patch", "patch_failed", "timeout", "infra_failure"]
Route = Literal["swebench", "r2e-swebench", "r2e-native"]
DEFAULT_TIMEOUT_S = {"swebench": 1800.0, "r2e-swebench": 1200.0, "r2e-native": 1200.0}


def _grading_sandbox() -> SandboxConfig:
    return SandboxConfig(memory="4g", pids=1024, cpus=2.0)  # and SandboxConfig's file-size bound


class GradeConfig(BaseModel):
    """Defaults for every grading run; a task's own `grading` limits override them, within `ceilings`."""

    sandbox: SandboxConfig = Field(default_factory=_grading_sandbox)
    ceilings: GradingCeilings = Field(
        DEFAULT_CEILINGS, description="the operator's ceilings on a task's own `grading` limits (env.tasks.ceilings)"
    )
    test_timeout_s: float | None = Field(
        None, gt=0, description="the test run's limit; None: the route's (swebench 1800 s, R2E-Gym 1200 s)"
    )
    apply_timeout_s: float = Field(120.0, gt=0)
    r2e_swebench_route: Literal["swebench", "r2e"] = Field(
        "swebench", description="R2E's SWE-bench rows: the official harness (default) or R2E-Gym's in-loop reward"
    )
    job: str = "grade"
    episode: str | None = Field(None, description="the episode graded (labels the container); None: grade-<task>")
    worker: str | None = Field(
        None, description="the process holding the grade's claim (labels the container: reaped once it holds no more)"
    )


class GradeResult(BaseModel):
    """A graded patch. `log` is the host-framed log (store it: `regrade` needs only it, the task, the patch)."""

    status: Status
    grader: str
    grader_version: str
    log: str = ""
    tests: dict[str, str] = Field(default_factory=dict)
    fail_to_pass: dict = Field(default_factory=dict)
    pass_to_pass: dict = Field(default_factory=dict)
    report: dict[str, Any] = Field(default_factory=dict, description="the grading tool's own report")
    needs_network: bool = False
    seconds: float = 0.0
    error: str | None = None


def route_of(task, config: GradeConfig | None = None) -> Route:
    if task.kind == "r2e":
        return "r2e-native"
    if task.kind == "r2e_swebench" and (config or GradeConfig()).r2e_swebench_route == "r2e":
        return "r2e-swebench"
    return "swebench"


def grader_of(task, config: GradeConfig | None = None) -> tuple[str, str]:
    """(grader name, tool version) recorded with every result."""
    return _grader(task, route_of(task, config))


def _grader(task, route: Route) -> tuple[str, str]:
    if route == "swebench":
        return route, official.grader_version(task)
    if route == "r2e-swebench":
        from env.tasks.swebench_legacy import VERDICT_VERSION

        return route, f"{r2e.R2E_VERSION}; swebench=={VERDICT_VERSION}"
    return route, f"{r2e.R2E_VERSION}; parse_log_pytest exact match"


def _limits(task, config: GradeConfig, route: Route) -> tuple[SandboxConfig, float]:
    """The grading container's limits and the test run's: GradeConfig's, then the task's own. A task whose own
    limits pass `config.ceilings` raises GradingLimitError (a ValueError) naming the field and the ceiling."""
    check_limits(task.instance_id, task.grading, config.ceilings)
    own = task.grading.model_dump(include={"memory", "cpus", "pids", "network"}, exclude_none=True)
    # the environment is the route's tool's, whatever GradeConfig.sandbox says: swebench's harness keeps the
    # image's (ENV, PATH included) as root; R2E-Gym puts its DOCKER_PATH over it as the image's USER.
    own.update(official.SANDBOX if route == "swebench" else r2e.SANDBOX)
    sandbox = SandboxConfig.model_validate({**config.sandbox.model_dump(), **own})  # validated, unlike model_copy
    timeout = task.grading.timeout_s or config.test_timeout_s or DEFAULT_TIMEOUT_S[route]
    return sandbox, timeout


def grade(task, patch: str, *, config: GradeConfig | None = None) -> GradeResult:
    """Grade `patch` for `task` in a fresh container; every failure becomes a status with a reason."""
    config = config or GradeConfig()
    if not patch or not patch.strip():
        grader, version = grader_of(task, config)
        return GradeResult(status="empty_patch", grader=grader, grader_version=version, error="the patch is empty")
    return _grade(task, patch, config)


def grade_base_state(task, *, config: GradeConfig | None = None) -> GradeResult:
    """Run the grading tests on the untouched base state (task validation: F2P must fail, P2P pass)."""
    return _grade(task, None, config or GradeConfig())


def _grade(task, patch: str | None, config: GradeConfig) -> GradeResult:
    from env.tasks.images import ImageError, ensure_task_image
    from env.tasks.swebench_legacy import LegacySwebenchError

    started = time.monotonic()
    route = route_of(task, config)
    log = hostlog.HostLog(task=task.instance_id, route=route)
    spec = None
    try:
        sandbox_config, timeout = _limits(task, config, route)
        if route == "swebench" and task.image_assets and not sandbox_config.network:
            raise ValueError("the task's image_assets are fetched from the internet and grading has no network")
        image = ensure_task_image(task)
        if route == "swebench":
            spec = official.make_spec(official.spec_row(task, image))
        with Sandbox.start(
            image,
            config=sandbox_config,
            job=config.job,
            episode=config.episode or f"grade-{task.instance_id}",
            labels={"nexus-eval.role": "grade", **({WORKER_LABEL: config.worker} if config.worker else {})},
        ) as box:
            kwargs = {"timeout_s": timeout, "apply_timeout_s": config.apply_timeout_s}
            if route == "swebench":
                official.run_eval(box, spec, patch, log, **kwargs)
            elif route == "r2e-native":
                r2e.run_native(box, patch, log, **kwargs)
            else:
                r2e.run_swebench_image(box, patch, log, **kwargs)
    except (ImageError, SandboxError, LegacySwebenchError, ValueError) as exc:
        log.infra(f"{type(exc).__name__}: {exc}")
    result = _evaluate(task, log.text(), patch, config, spec=spec)
    result.seconds = time.monotonic() - started
    return result


def regrade(task, log: str, patch: str | None, *, config: GradeConfig | None = None) -> GradeResult:
    """Re-derive the status from a stored grading log (no container, no Docker needed)."""
    config = config or GradeConfig()
    log, cut = hostlog.unpack_bounded(log)
    if patch is not None and not patch.strip():
        grader, version = grader_of(task, config)
        return GradeResult(
            status="empty_patch", grader=grader, grader_version=version, log=log, error="the patch is empty"
        )
    if cut:  # its sections' END frames may be in the part not unpacked: no verdict can be trusted
        grader, version = grader_of(task, config)
        error = f"the stored log unpacks to more than {hostlog.UNPACK_MAX_BYTES} bytes; it was cut there"
        return GradeResult(status="infra_failure", grader=grader, grader_version=version, log=log, error=error)
    return _evaluate(task, log, patch, config)


_OMITTED = re.compile(r"\[\.\.\. output truncated: (\d+) bytes omitted from the middle \.\.\.\]")


def _cut_note(body: str) -> str | None:
    """What a verdict on a test log read back capped (`Sandbox.run_to_file`) must say: tests reported only in
    the omitted middle were not read, so a verdict other than resolved may differ from the tool's own on the
    whole log. None when nothing was omitted."""
    omitted = sum(int(n) for n in _OMITTED.findall(body))
    if not omitted:
        return None
    return (
        f"the test log was cut: {omitted} bytes omitted from its middle (first {FILE_OUTPUT_HEAD_BYTES} and last "
        f"{FILE_OUTPUT_TAIL_BYTES} bytes kept); tests reported only there were not read"
    )


def _evaluate(task, log: str, patch: str | None, config: GradeConfig, *, spec=None) -> GradeResult:
    """The verdict a framed log supports; `spec` is the swebench test spec when the caller already built it."""
    parsed = hostlog.parse(log)
    route = parsed.route if parsed else route_of(task, config)
    grader, version = _grader(task, route)
    base = {"grader": grader, "grader_version": version, "log": log, "needs_network": task.needs_network}
    sections = parsed.sections if parsed else {}
    test_section = "eval" if route == "swebench" else "tests"

    def result(status: Status, error: str | None = None, **extra) -> GradeResult:
        cut = _cut_note(sections[test_section].body) if test_section in sections else None
        if cut and status != "resolved":  # every test the verdict needs was read when it is resolved
            error = f"{error}; {cut}" if error else cut
        return GradeResult(status=status, error=error, **base, **extra)

    if parsed is None:
        return result("infra_failure", "not a nexus-eval grading log (no v2 header line)")
    if parsed.infra:
        return result("infra_failure", parsed.infra[-1])
    applies = [name for name in sections if name.startswith("apply.")]
    if patch is not None and test_section not in sections:
        last = sections[applies[-1]].body[-800:] if applies else "no apply attempt recorded"
        return result("patch_failed", f"the patch did not apply: {last}")
    if test_section not in sections:
        return result("infra_failure", f"the log has no {test_section} section")
    tests = sections[test_section]
    if tests.timed_out:
        return result("timeout", f"the test run passed its limit (rc={tests.rc})")
    if route == "swebench":
        spec = spec or official.make_spec(official.spec_row(task, "graded-image"))
        judged = official.verdict(spec, tests, patch)
        report = judged["report"].get("tests_status", {})
        error = judged["vetoed"] or (None if judged["found"] else "swebench found no trustworthy test results")
        return result(
            "resolved" if judged["resolved"] else "unresolved",
            error,
            tests=judged["tests"],
            fail_to_pass=report.get("FAIL_TO_PASS", {}),
            pass_to_pass=report.get("PASS_TO_PASS", {}),
            report=judged["report"],
        )
    if route == "r2e-native":
        judged = r2e.native_verdict(tests.body, task.expected_output_json or "{}")
        error = (
            None
            if judged["resolved"]
            else f"{len(judged['differing'])} test keys differ, e.g. {judged['differing'][:5]}"
        )
        return result("resolved" if judged["resolved"] else "unresolved", error, tests=judged["tests"], report=judged)
    from env.tasks.swebench_legacy import r2e_swebench_verdict

    output = r2e.swebench_image_output(tests.body, tests.rc, DEFAULT_TIMEOUT_S[route])
    judged = r2e_swebench_verdict(dict(task.source_row), output)
    report = judged.get("report") or {}
    return result(
        "resolved" if judged["resolved"] else "unresolved",
        None if judged["found"] else "R2E-Gym's log check found a bad marker",
        tests=judged.get("status_map") or {},
        fail_to_pass=report.get("FAIL_TO_PASS", {}),
        pass_to_pass=report.get("PASS_TO_PASS", {}),
        report=judged,
    )
