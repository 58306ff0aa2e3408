"""The agent loop: model completes -> parse the call -> the tool runs -> observation back; limits end it.

Exit statuses are exceptions (subclasses of ``agent_runner.status.AgentExit``), raised where the reason is found
and caught once in :meth:`Agent.run`, which turns them (and anything unexpected) into ``EpisodeResult.exit_status``
through the one status rule, ``agent_runner.status.status_of``. The checks after
every turn run in R2E-Gym's order: submitted, context, absolute steps, wall time, then (ours) consecutive
format errors. The soft limit (``soft_step_limit``, DeepSWE's 40) only changes the "Steps Remaining" text
the model sees; the absolute limit (``max_steps``, 100) stops the loop.

The texts (system and instance prompts, step-budget line, the reply to a completion without a call) come from
the config's scaffold (``AgentConfig.scaffold()``): ours by default, R2E-Gym's own when ``prompts`` names its
YAML. It is loaded when the Agent is built, so a bad prompt file raises ValueError before the first turn.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from agent_runner.backends import Model, ModelError
from agent_runner.config import AgentConfig
from agent_runner.environment import Environment
from agent_runner.parsing import ParsedAction, parse_response, resynthesize
from agent_runner.records import (
    SKIPPED_OBSERVATION,
    Completion,
    EpisodeResult,
    EpisodeTotals,
    Intervention,
    Message,
    OperatorAct,
    ScaffoldRecord,
    TurnRecord,
)
from agent_runner.scaffold import Scaffold
from agent_runner.status import (
    AgentExit,
    ContextLimit,
    FormatErrorLimit,
    InfraFailure,
    StepLimit,
    Submitted,
    TimeLimit,
    status_of,
)
from env.sandbox.container import SandboxError
from env.sandbox.tools import ToolCall, ToolResult


class TaskLike(Protocol):
    instance_id: str
    problem_statement: str


#: ``intervene(turn_index, parsed, raw_completion_text)``: None keeps the model's action; a ParsedAction replaces
#: it; an :class:`Intervention` says what the operator did (and what runs)
Intervene = Callable[[int, ParsedAction, str], ParsedAction | Intervention | None]


class Agent:
    """Runs episodes of ``model`` under ``config``'s limits and prompts. ``on_turn`` sees every TurnRecord as
    it is made (persist it, print it); ``intervene(turn_index, parsed, raw)`` may return a replacement action
    or an :class:`Intervention` before it executes (interactive rerun), or None to keep the model's."""

    def __init__(
        self,
        model: Model,
        config: AgentConfig | None = None,
        *,
        on_turn: Callable[[TurnRecord], Any] | None = None,
        intervene: Intervene | None = None,
    ):
        self.model = model
        self.config = config or AgentConfig()
        self.scaffold: Scaffold = self.config.scaffold()  # ScaffoldError (ValueError) for a bad YAML
        self.on_turn = on_turn
        self.intervene = intervene
        self.env: Environment | None = None
        self.messages: list[Message] = []
        self.turns: list[TurnRecord] = []
        self.started = 0.0
        self.format_errors = 0

    def run(self, environment: Environment, task: TaskLike, *, seed: int) -> EpisodeResult:
        """The whole episode in ``environment``: turns until an exit; every outcome, even a crash, is a
        returned status. ``seed`` (the episode's one seed) resets the backend, seeding its sampler."""
        cfg = self.config
        self.env = environment
        self.started = time.monotonic()
        self.format_errors = 0
        self.turns = []
        self.messages = [
            Message(role="system", content=self.scaffold.system_prompt()),
            Message(role="user", content=self.scaffold.instance_prompt(task, cfg.soft_step_limit)),
        ]
        scaffold = ScaffoldRecord(**self.scaffold.record(m.content for m in self.messages))
        ended: BaseException | None = None
        error, unexpected = None, None
        try:
            self.model.reset(seed=seed)
            for index in range(cfg.max_steps):
                self._turn(index)  # raises an AgentExit when the model submits or a limit is reached
            raise StepLimit(f"reached max_steps={cfg.max_steps}")
        except AgentExit as exc:
            ended = exc
            error = _describe(exc)
            unexpected = exc.__cause__ if isinstance(exc, InfraFailure) else None  # e.g. a time limit in decode
        except Exception as exc:  # a bug, an on_turn failure or a time limit raised into the loop: turns kept
            ended = unexpected = exc
            error = "unexpected " + "".join(traceback.format_exception(exc)).strip()
        result = EpisodeResult(
            task_id=task.instance_id,
            exit_status=status_of(interrupted=ended),  # the AgentExit's word; anything else: infra_failure
            error=error,
            turns=self.turns,
            messages=self.messages,
            config={"agent": cfg.model_dump(mode="json")},
            timings={"agent_s": time.monotonic() - self.started},
            totals=EpisodeTotals.of(self.turns),
            scaffold=scaffold,
        )
        result.exception = unexpected
        return result

    def _turn(self, index: int) -> None:
        """One turn: complete, parse, (intervene), act, record; then raise the exit if this turn ends the run."""
        completion, model_s = self._complete()
        parsed = parse_response(completion.text, duplicates=self.config.duplicate_params)
        parsed, intervened, act = self._intervene(index, parsed, completion.text)
        skipped = act is not None and act.choice == "skip"
        replaced = intervened and not skipped  # a skip keeps the model's own action in its history
        self.messages.append(Message(role="assistant", content=self._history(completion, parsed, replaced)))
        result = self._step(parsed.call, completion, skipped=skipped)
        self.format_errors = 0 if parsed.call else self.format_errors + 1
        turn = TurnRecord(
            index=index,
            completion=completion,
            thought=parsed.thought,
            action=parsed.call,
            parse_error=parsed.error,
            format_error=parsed.call is None,
            intervened=intervened,
            operator=act,
            observation=result.observation,
            submitted=result.submitted,
            env_s=result.seconds,
            model_s=model_s,
            steps_remaining=self.config.soft_step_limit - index - 1,
        )
        stop = self._exit_after(turn, time.monotonic() - self.started)
        if stop is None:
            turn.user_message = self.scaffold.observation_message(result.observation, turn.steps_remaining)
            self.messages.append(Message(role="user", content=turn.user_message))
        self.turns.append(turn)
        if self.on_turn is not None:
            self.on_turn(turn)
        if stop is not None:
            raise stop

    def _complete(self) -> tuple[Completion, float]:
        t0 = time.monotonic()
        try:
            completion = self.model.complete(list(self.messages))
        except ModelError as exc:
            raise InfraFailure(f"model: {exc}") from exc
        except Exception as exc:
            raise InfraFailure(f"model raised {type(exc).__name__}: {exc}") from exc
        return completion, time.monotonic() - t0

    def _intervene(self, index: int, parsed: ParsedAction, raw: str) -> tuple[ParsedAction, bool, OperatorAct | None]:
        """(the action to take, whether the operator replaced or skipped the model's, what the operator did)."""
        answer = self.intervene(index, parsed, raw) if self.intervene is not None else None
        if answer is None:
            return parsed, False, None
        if isinstance(answer, ParsedAction):
            return answer, True, None
        if answer.action is not None:
            return answer.action, True, answer.act
        return parsed, answer.act.choice == "skip", answer.act

    def _history(self, completion: Completion, parsed: ParsedAction, intervened: bool) -> str:
        return resynthesize(parsed) if intervened or self.config.history == "resynthesized" else completion.text

    def _step(self, call: ToolCall | None, completion: Completion, *, skipped: bool = False) -> ToolResult:
        if completion.context_full or completion.prompt_tokens >= self.config.max_context_tokens:
            return ToolResult(observation="", submitted=False, seconds=0.0)  # over budget: do not act
        if skipped:  # the operator skipped the action: nothing runs in the container
            return ToolResult(observation=SKIPPED_OBSERVATION, submitted=False, seconds=0.0)
        if call is None:
            return ToolResult(observation=self.scaffold.no_call_reply, submitted=False, seconds=0.0)
        try:
            return self.env.step(call)
        except Exception as exc:  # SandboxError (container died) and anything else the sandbox raises
            raise InfraFailure(f"environment: {call.name} failed: {type(exc).__name__}: {exc}") from exc

    def _exit_after(self, turn: TurnRecord, elapsed_s: float) -> AgentExit | None:
        cfg = self.config
        steps_done = turn.index + 1
        logical = turn.completion.logical_length
        if turn.submitted:
            return Submitted(f"submitted at step {steps_done}")
        if turn.completion.context_full:  # the backend's own window (e.g. the model's positions) is the tighter one
            return ContextLimit(f"logical length {turn.completion.prompt_tokens}: the model's context window is full")
        if turn.completion.prompt_tokens >= cfg.max_context_tokens or logical >= cfg.max_context_tokens:
            return ContextLimit(f"logical length {logical} >= max_context_tokens={cfg.max_context_tokens}")
        if steps_done >= cfg.max_steps:
            return StepLimit(f"reached max_steps={cfg.max_steps}")
        if elapsed_s >= cfg.wall_time_s:
            return TimeLimit(f"{elapsed_s:.1f}s >= wall_time_s={cfg.wall_time_s}")
        if cfg.max_format_errors is not None and self.format_errors >= cfg.max_format_errors:
            return FormatErrorLimit(f"{self.format_errors} consecutive turns without a function call")
        return None


def _describe(exc: AgentExit) -> str | None:
    """The reason text; for infra failures caused by an unexpected exception, with its traceback."""
    if isinstance(exc, Submitted):
        return None
    cause = exc.__cause__
    if cause is None or isinstance(cause, ModelError | SandboxError):
        return str(exc)
    return f"{exc}\n" + "".join(traceback.format_exception(cause)).strip()
