"""One episode from its ``EpisodeSpec``: the only way an episode runs (the CLI, a worker, an interactive rerun).

:func:`run_episode` does, in order:

1. **The task**: the one given (a worker's per-process ``TaskCache`` loaded it) or ``spec.load_task()``.
2. **The backend**: the one given (a test double; the CLI's preloaded one; a multi-episode worker's, built with
   ``loaded_models.backend_for(spec, task, episodes_per_gpu=...)``) or ``loaded_models.backend_for(spec, task)``, the
   process's loaded model; ``hooks.wrap_model`` may wrap it (``rerun --from-turn K`` forces the stored prefix).
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
``error`` (or ``grade_error``) on the returned :class:`EpisodeResult`, with the turns made so far kept. Every
status is decided by the one rule, ``agent_runner.status.status_of``. What the caller adds around the run (the
turn callback, the environment opener, the container labels...) is one :class:`EpisodeHooks`.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_runner.agent import Agent, Intervene
from agent_runner.backends import Model
from agent_runner.config import EpisodeSpec
from agent_runner.environment import DockerEnvironment, Environment
from agent_runner.records import EpisodeResult, TurnRecord
from agent_runner.status import INFRA_FAILURE, status_of

if TYPE_CHECKING:
    from env.sandbox.config import SandboxConfig
    from env.tasks.loading import Task


@dataclass(frozen=True)
class EpisodeHooks:
    """What a caller adds around one run; every field is optional. The one set of hooks of every path (the CLI's
    ``episode``, a worker's ``workers.execution.execute_episode``, the interactive rerun).

    wrap_model:       ``wrap_model(model)`` returns the backend to use (``--from-turn``: ``ForcedPrefix``).
    on_turn:          sees each TurnRecord as it is made (the worker stores it; the CLI and the operator print it).
    intervene:        may replace an action before it runs (``agent_runner.agent.Intervene``).
    open_environment: ``open_environment(task, labels=..., sandbox_config=...)`` replaces
                      ``DockerEnvironment.open`` (a test double; the interactive rerun wraps it).
    labels:           the container labels (``nexus-eval.job``, ``nexus-eval.episode``); the job label also
                      names the grading container's.
    sandbox_config:   the sandbox's resources and limits (None: ``DockerEnvironment``'s defaults).

    The worker's own (read by ``execute_episode``, not by :func:`run_episode`):

    progress:         receives ``{"turn", "max_steps", "action"}`` after each stored turn (Celery's PROGRESS).
    time_limits:      exception types that mean "out of time" when raised into the run (Celery's
                      ``SoftTimeLimitExceeded``); the run is then stored as ``timeout`` (``agent_runner.status``).
    """

    wrap_model: Callable[[Model], Model] | None = None
    on_turn: Callable[[TurnRecord], Any] | None = None
    intervene: Intervene | None = None
    open_environment: Callable[..., Environment] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    sandbox_config: SandboxConfig | None = None
    progress: Callable[[dict[str, Any]], None] | None = None
    time_limits: tuple[type[BaseException], ...] = ()


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


def _device_of(model: Model) -> str | None:
    """The device ``model``'s weights are on (a backend that hosts a model: ``host.device``), else None."""
    device = getattr(getattr(model, "host", None), "device", None)
    return None if device is None else str(device)


def run_episode(
    spec: EpisodeSpec,
    *,
    task: Task | None = None,
    model: Model | None = None,
    hooks: EpisodeHooks = EpisodeHooks(),
) -> EpisodeResult:
    """Run the episode ``spec`` describes, in a real container, and grade it (see the module docstring).

    ``task``: the loaded task (its id must be ``spec.task_id``). ``model``: the backend to use instead of
    ``backend_for(spec, task)`` (a test double, the CLI's preloaded one, a multi-episode worker's engine-backed one).
    ``hooks``: what the caller adds around the run (:class:`EpisodeHooks`). ``EpisodeResult.config`` records
    what ran: the spec, the sandbox config, the backend's class and the device the model is on.
    """
    from agent_runner.loaded_models import backend_for

    # 1-3: inputs, each a ValueError before any container starts
    task = task if task is not None else spec.load_task()
    if task.instance_id != spec.task_id:
        raise ValueError(f"the task given is {task.instance_id!r} but the episode names {spec.task_id!r}")
    model = model if model is not None else backend_for(spec, task)
    device = _device_of(model)
    if hooks.wrap_model is not None:
        model = hooks.wrap_model(model)
    agent = Agent(model, spec.agent, on_turn=hooks.on_turn, intervene=hooks.intervene)  # a bad prompt file: ValueError
    sandbox_config = hooks.sandbox_config
    config = {
        "episode": spec.model_dump(mode="json"),
        "sandbox": sandbox_config.model_dump(mode="json") if sandbox_config is not None else None,
        "model": type(model).__name__,
        "device": device,
    }
    # 4: the sandbox
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        environment = (hooks.open_environment or DockerEnvironment.open)(
            task, labels=dict(hooks.labels), sandbox_config=sandbox_config
        )
    except Exception as exc:  # ImageMissing, SandboxError, docker errors: recorded, nothing started
        failed = EpisodeResult(
            task_id=task.instance_id,
            exit_status=status_of(interrupted=exc),
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
            failure = f"taking the diff failed: {_failure(exc)}"
            if result.exit_status == INFRA_FAILURE:
                _note(result, failure)
            else:  # this is the run's first failure: its reason leads, the agent's exit follows
                agent = f"the agent had exited with {result.exit_status}" + (
                    f": {result.error}" if result.error else ""
                )
                result.error = f"{failure}\n{agent}"
            result.exit_status = status_of(interrupted=exc)  # what broke the run decides, not the agent's exit
        timings["diff_s"] = time.monotonic() - t0
    finally:
        close_error = _close(environment)
    if close_error:
        _note(result, close_error)
    timings["agent_s"] = result.timings.get("agent_s", 0.0)
    # 7: the grade
    if spec.grade and result.patch is not None and result.exit_status != INFRA_FAILURE:
        t0 = time.monotonic()
        try:
            from env.grading import grade as grade_patch

            job = hooks.labels.get("nexus-eval.job", "grade")
            result.grade = grade_patch(task, result.patch, config=spec.grade_config(job=job))
        except Exception as exc:
            result.grade_error = _failure(exc)
        timings["grade_s"] = time.monotonic() - t0
    timings["total_s"] = time.monotonic() - started
    result.timings = timings
    result.config = {**result.config, **config}
    return result
