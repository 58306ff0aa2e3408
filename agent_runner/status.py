"""The one rule that decides an episode's stored status, and the words it decides between.

Every layer that ends a run asks :func:`status_of` with what it knows, and nothing else maps an exception or an
interruption to a status word:

- the agent loop (``agent_runner.agent.Agent.run``): the :class:`AgentExit` that ended the loop, or the unexpected
  exception that broke it;
- the episode runner (``agent_runner.episode.run_episode``): the sandbox could not open, or the diff could not be
  taken (the run is broken whatever the agent's exit);
- the worker (``workers.execution.execute_episode``): the agent's exit if the run returned, the exception that
  interrupted it, and which exception types mean "out of time" there (its own soft deadline, Celery's
  ``SoftTimeLimitExceeded``);
- Celery's failure handler (``workers.celery_tasks.EpisodeTask.on_failure``): the exception that killed the
  task, with ``TimeLimitExceeded`` as its time limit.

Every status word an episode can have is defined here, once (:class:`EpisodeStatus`): the agent is the lowest
layer that needs them, and ``db.models`` stores them (its CHECK constraints and named sets are built from this
enum; ``db`` imports nothing else of ``agent_runner``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class EpisodeStatus(StrEnum):
    """The stored status of one attempt (``episodes.status``)."""

    queued = "queued"
    running = "running"
    # grading verdicts (final)
    resolved = "resolved"
    unresolved = "unresolved"
    empty_patch = "empty_patch"
    patch_failed = "patch_failed"
    # the agent's exit statuses: the agent is done, the grade is not (yet) recorded
    submitted = "submitted"
    step_limit = "step_limit"
    context_limit = "context_limit"
    time_limit = "time_limit"  # the agent's own wall-time limit (AgentConfig.wall_time_s)
    format_error_limit = "format_error_limit"
    # the run broke (the model host, the sandbox, a bug), or the service's time limit interrupted it
    timeout = "timeout"  # the worker's soft deadline or Celery's time limits, not the agent's wall-time limit
    infra_failure = "infra_failure"
    cancelled = "cancelled"


# the words status_of decides between, as plain strings
SUBMITTED = EpisodeStatus.submitted.value
STEP_LIMIT = EpisodeStatus.step_limit.value
CONTEXT_LIMIT = EpisodeStatus.context_limit.value
TIME_LIMIT = EpisodeStatus.time_limit.value
FORMAT_ERROR_LIMIT = EpisodeStatus.format_error_limit.value
INFRA_FAILURE = EpisodeStatus.infra_failure.value
TIMEOUT = EpisodeStatus.timeout.value

AGENT_EXITS = frozenset({SUBMITTED, STEP_LIMIT, CONTEXT_LIMIT, TIME_LIMIT, FORMAT_ERROR_LIMIT})
#: every word :func:`status_of` can return
STATUSES = AGENT_EXITS | {INFRA_FAILURE, TIMEOUT}


class AgentExit(Exception):
    """Ends the agent loop; ``exit_status`` is the word stored with the episode."""

    exit_status: ClassVar[str]


class Submitted(AgentExit):
    exit_status = SUBMITTED


class StepLimit(AgentExit):
    exit_status = STEP_LIMIT


class ContextLimit(AgentExit):
    exit_status = CONTEXT_LIMIT


class TimeLimit(AgentExit):
    exit_status = TIME_LIMIT


class FormatErrorLimit(AgentExit):
    exit_status = FORMAT_ERROR_LIMIT


class InfraFailure(AgentExit):
    """The model host or the sandbox failed (wraps env.sandbox.config.SandboxError, ModelError and anything else)."""

    exit_status = INFRA_FAILURE


def status_of(
    exit_status: str | None = None,
    interrupted: BaseException | None = None,
    *,
    time_limits: tuple[type[BaseException], ...] = (),
) -> str:
    """The status a run ends with.

    ``exit_status``: the agent's exit when the run returned one (None: it did not return, or what broke it
    overrides the exit, as a diff that cannot be taken does). ``interrupted``: the exception that ended or broke
    the run, if any. ``time_limits``: the exception types that mean "out of time" to the caller.

    In order: an interruption by one of ``time_limits`` is ``timeout`` (the partial trajectory is kept); else the
    agent's exit, when given; else an :class:`AgentExit`'s own word; else (an unexpected exception, or nothing
    at all) ``infra_failure``.
    """
    if interrupted is not None and time_limits and isinstance(interrupted, time_limits):
        return TIMEOUT
    if exit_status is not None:
        return exit_status
    if isinstance(interrupted, AgentExit):
        return interrupted.exit_status
    return INFRA_FAILURE
