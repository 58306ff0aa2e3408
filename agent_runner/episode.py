"""One episode from its ``EpisodeSpec``: the only way an episode runs (the CLI, a worker, an interactive rerun).

:func:`run_episode` does, in order:

1. **The task**: the one given (a worker's per-process ``TaskCache`` loaded it) or ``spec.load_task()``.
2. **The backend**: the one given (a test double) or ``model_cache.backend_for(spec, ...)``, the process's
   loaded model; ``wrap_model`` may wrap it (``rerun --from-turn K`` forces the stored prefix).
3. **The prompts**: ``spec.agent.scaffold()``. Steps 1-3 raise ValueError for bad input, before any container.
4. **The sandbox** (``DockerEnvironment.open``). A failure here -> ``infra_failure``, no turns.
5. **The agent** (``Agent.run(environment, task, seed=spec.seed)``): the seed is applied here, once, by resetting the
   backend with it (its sampler); the eviction policy draws from ``spec.eviction.seed``, which ``EpisodeSpec``
   holds equal to it. The exit status is kept whatever happens next. The backend's final cache is read at once
   (``retention``: the backend holds the cache until its next ``reset``).
6. **The diff** -> ``patch``, then the sandbox closes. If the diff cannot be taken (the container or the engine
   died) there is nothing to grade: the run is an ``infra_failure`` whatever the agent's exit, with that reason
   first and the agent's exit after it.
7. **The grade**, in a fresh container, when ``spec.grade``. R2E grades every trajectory whatever the agent's
   exit reason; so do we, except after an ``infra_failure`` (the run is broken, not the agent's answer: rerun
   it) or when there is no patch.

From step 4 on nothing raises for what goes wrong in the episode: every failure ends up as ``exit_status`` +
``error`` (or ``grade_error``) on the returned :class:`EpisodeResult`, with the turns made so far kept.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_runner.agent import Agent, Intervene
from agent_runner.backends import Model
from agent_runner.config import EpisodeSpec
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
    spec: EpisodeSpec,
    *,
    task: Task | None = None,
    model: Model | None = None,
    episodes_per_gpu: int = 1,
    wrap_model: Callable[[Model], Model] | None = None,
    sandbox_config: SandboxConfig | None = None,
    labels: dict[str, str] | None = None,
    on_turn: Callable[[TurnRecord], Any] | None = None,
    intervene: Intervene | None = None,
    open_environment: Callable[..., Environment] | None = None,
) -> EpisodeResult:
    """Run the episode ``spec`` describes, in a real container, and grade it (see the module docstring).

    ``task``: the loaded task (its id must be ``spec.task_id``). ``model``: a backend to use instead of the
    one ``spec`` names (a test double). ``episodes_per_gpu``: > 1 decodes this episode's turns together with
    the process's other episodes (``agent_runner.engine``). ``open_environment(task, labels=...,
    sandbox_config=...)`` replaces ``DockerEnvironment.open``. ``on_turn`` sees each TurnRecord as it is made;
    ``intervene`` may replace an action before it runs (``agent_runner.agent.Intervene``).
    """
    from agent_runner.model_cache import backend_for

    # 1-3: inputs, each a ValueError before any container starts
    task = task if task is not None else spec.load_task()
    if task.instance_id != spec.task_id:
        raise ValueError(f"the task given is {task.instance_id!r} but the episode names {spec.task_id!r}")
    model = model if model is not None else backend_for(spec, task, episodes_per_gpu=episodes_per_gpu)
    if wrap_model is not None:
        model = wrap_model(model)
    agent = Agent(model, spec.agent, on_turn=on_turn, intervene=intervene)  # a bad prompt file: ValueError
    config = {
        "episode": spec.model_dump(mode="json"),
        "sandbox": sandbox_config.model_dump(mode="json") if sandbox_config is not None else None,
        "model": type(model).__name__,
    }
    # 4: the sandbox
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        environment = (open_environment or DockerEnvironment.open)(
            task, labels=dict(labels or {}), sandbox_config=sandbox_config
        )
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
    # 5-6: the agent, seeded once; then the final cache and the diff
    try:  # Agent.run records its own failures; only KeyboardInterrupt & co. pass through (after close)
        result = agent.run(environment, task, seed=spec.seed)
        result.retention, retention_error = final_retention(model)
        if retention_error:
            _note(result, retention_error)
        t0 = time.monotonic()
        try:
            result.patch = environment.diff()
        except Exception as exc:  # the container is gone: no patch, so no verdict whatever the agent's exit
            result.exception = result.exception or exc
            if result.exit_status == "infra_failure":
                _note(result, f"taking the diff failed: {_failure(exc)}")
            else:  # this is the run's first failure: its reason leads, the agent's exit follows
                agent = f"the agent had exited with {result.exit_status}" + (
                    f": {result.error}" if result.error else ""
                )
                result.error = f"taking the diff failed: {_failure(exc)}\n{agent}"
                result.exit_status = "infra_failure"
        timings["diff_s"] = time.monotonic() - t0
    finally:
        close_error = _close(environment)
    if close_error:
        _note(result, close_error)
    timings["agent_s"] = result.timings.get("agent_s", 0.0)
    # 7: the grade
    if spec.grade and result.patch is not None and result.exit_status != "infra_failure":
        t0 = time.monotonic()
        try:
            from env.grading import grade as grade_patch

            job = (labels or {}).get("nexus-eval.job", "grade")
            result.grade = grade_patch(task, result.patch, config=spec.grade_config(job=job))
        except Exception as exc:
            result.grade_error = _failure(exc)
        timings["grade_s"] = time.monotonic() - t0
    timings["total_s"] = time.monotonic() - started
    result.timings = timings
    result.config = {**result.config, **config}
    return result
