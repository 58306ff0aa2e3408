"""Shared pieces for the agent tests: an in-process Environment test double and a tiny task."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from env.sandbox.tools import ToolCall, ToolResult
from tests.conftest import docker_status, require


@dataclass
class TinyTask:
    """Just the fields the agent loop reads from env.tasks.loading.Task."""

    instance_id: str = "demo__tiny-1"
    problem_statement: str = "Calling add(2, 2) returns 5."
    kind: str = "local"
    patch: str = ""
    test_patch: str = ""


class RecordingEnvironment:
    """Test double for a task sandbox: records every call and answers with canned observations.

    ``finish``/``submit`` submit; ``fail_on`` names a tool whose call raises ``error`` (to exercise the
    infra path); everything else echoes the call. ``diff_text`` is what ``diff()`` returns.
    """

    def __init__(
        self, *, fail_on: str | None = None, error: Exception | None = None, diff_text: str = "", seconds: float = 0.01
    ) -> None:
        self.calls: list[ToolCall] = []
        self.fail_on, self.error, self.diff_text, self.seconds = fail_on, error, diff_text, seconds
        self.closed = False

    def step(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        if call.name == self.fail_on:
            raise self.error or RuntimeError("container died")
        if call.name in {"finish", "submit"}:
            return ToolResult(observation="<<< Finished >>>", submitted=True, seconds=self.seconds)
        args = " ".join(f"{k}={v}" for k, v in call.arguments.items())
        return ToolResult(
            observation=f"Execution output of [{call.name}]:\n{args}", submitted=False, seconds=self.seconds
        )

    def diff(self) -> str:
        return self.diff_text

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def task() -> TinyTask:
    return TinyTask()


@pytest.fixture
def environment() -> RecordingEnvironment:
    return RecordingEnvironment()


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Skip locally, fail under CI, unless the engine and base image are there."""
    ok, reason = docker_status()
    require(ok, reason)


def run_loop(model, environment, task, config=None, *, seed: int = 0, on_turn=None, intervene=None):
    """One agent loop (``Agent.run``) with the episode seed ``seed``: the loop without a sandbox or a grade."""
    from agent_runner.agent import Agent

    return Agent(model, config, on_turn=on_turn, intervene=intervene).run(environment, task, seed=seed)
