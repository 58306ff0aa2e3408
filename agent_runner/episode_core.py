"""One episode end to end: open the task's sandbox, run the agent, take the diff, grade in a fresh container.

:func:`run_episode` is what the CLI (``nexus-eval episode``) and the Celery worker call. It never raises for
anything that goes wrong during the episode: every failure ends up as ``exit_status`` + ``error`` (or
``grade_error``) on the returned :class:`EpisodeResult`, with the turns made so far kept.

Order of events:
1. ``DockerEnvironment.open`` (image, container, tools). A failure here -> ``infra_failure``, no turns.
2. ``Agent.run``: the loop; its exit status is kept whatever happens next. The backend's final cache is
   read at once (``retention``: the backend still holds the cache until its next ``reset``).
3. ``environment.diff()`` -> ``patch`` (None if the container died: then nothing is graded).
4. The sandbox is closed, then ``env.grading.grade(task, patch)`` runs in a fresh container when
   ``grade=True``. R2E grades every trajectory whatever the agent's exit reason; so do we, except after an
   ``infra_failure`` (the run is broken, not the agent's answer: rerun it) or when there is no patch.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_runner.agent import Intervene, run_agent
from agent_runner.backends import Model
from agent_runner.config import AgentConfig
from agent_runner.environment import DockerEnvironment, Environment
from agent_runner.records import EpisodeResult, TurnRecord

if TYPE_CHECKING:
    from env.sandbox import SandboxConfig
    from env.tasks import Task


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).strip()


def _note(result: EpisodeResult, note: str) -> None:
    result.error = f"{result.error}\n{note}" if result.error else note


def _close(environment: Environment) -> str | None:
    try:
        environment.close()
    except Exception as exc:  # must not hide the episode's own outcome; recorded on it instead
        return f"closing the sandbox failed: {_failure(exc)}"
    return None


def final_retention(model: Model) -> tuple[dict[str, Any] | None, str | None]:
    """(the retention map of ``model``'s final cache, or None; an error note if reading it failed).

    A backend that keeps a cache (hf) has ``retention()`` (see ``agent_runner.backends``); others have none.
    Reading it never ends the episode: a failure is noted on the result and the map is left out."""
    read = getattr(model, "retention", None)
    if read is None:
        return None, None
    try:
        return read(), None
    except Exception as exc:
        return None, f"reading the final cache's retention map failed: {_failure(exc)}"


def run_episode(
    task: Task,
    model: Model,
    *,
    agent_config: AgentConfig | None = None,
    sandbox_config: SandboxConfig | None = None,
    grade: bool = True,
    grade_config: Any = None,
    labels: dict[str, str] | None = None,
    on_turn: Callable[[TurnRecord], Any] | None = None,
    intervene: Intervene | None = None,
    open_environment: Callable[..., Environment] | None = None,
) -> EpisodeResult:
    """Run ``model`` on ``task`` in a real container and grade the patch. See the module docstring.

    ``open_environment(task, labels=..., sandbox_config=...)`` defaults to ``DockerEnvironment.open``;
    tests may pass another factory. ``grade_config`` is passed through to ``env.grading.grade``.
    """
    agent_config = agent_config or AgentConfig()
    agent_config.scaffold()  # a prompt file that cannot be used fails here, before any container starts
    opener = open_environment or DockerEnvironment.open
    config = {
        "agent": agent_config.model_dump(mode="json"),
        "sandbox": sandbox_config.model_dump(mode="json") if sandbox_config is not None else None,
        "model": type(model).__name__,
    }
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        environment = opener(task, labels=dict(labels or {}), sandbox_config=sandbox_config)
    except Exception as exc:  # ImageMissing, SandboxError, docker errors: recorded, nothing started
        failed = EpisodeResult(
            task_id=task.instance_id,
            exit_status="infra_failure",
            config=config,
            error=f"opening the environment failed: {_failure(exc)}",
            timings={"setup_s": time.monotonic() - started},
        )
        failed.exception = exc
        return failed
    timings["setup_s"] = time.monotonic() - started
    try:  # run_agent records its own failures; only KeyboardInterrupt & co. pass through (after close)
        result = run_agent(model, environment, task, agent_config, on_turn=on_turn, intervene=intervene)
        result.retention, retention_error = final_retention(model)
        if retention_error:
            _note(result, retention_error)
        t0 = time.monotonic()
        try:
            result.patch = environment.diff()
        except Exception as exc:
            _note(result, f"taking the diff failed: {_failure(exc)}")
            result.exception = result.exception or exc
            if result.exit_status == "submitted":
                result.exit_status = "infra_failure"
        timings["diff_s"] = time.monotonic() - t0
    finally:
        close_error = _close(environment)
    if close_error:
        _note(result, close_error)
    timings["agent_s"] = result.timings.get("agent_s", 0.0)
    if grade and result.patch is not None and result.exit_status != "infra_failure":
        t0 = time.monotonic()
        try:
            from env.grading import grade as grade_patch

            result.grade = grade_patch(task, result.patch, config=grade_config)
        except Exception as exc:
            result.grade_error = _failure(exc)
        timings["grade_s"] = time.monotonic() - t0
    timings["total_s"] = time.monotonic() - started
    result.timings = timings
    result.config = {**result.config, **config}
    return result


def run_oracle_episode(task: Task, **kwargs: Any) -> EpisodeResult:
    """The pipeline check: the gold patch applied through the agent's own tools, then graded (-> resolved)."""
    from agent_runner.backends.oracle import OracleModel

    return run_episode(task, OracleModel(task), **kwargs)
