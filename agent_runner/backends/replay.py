"""ReplayModel: re-run an episode from a stored turn onwards (``nexus-eval rerun --from-turn K``).

The first ``len(recorded)`` calls return the recorded completions (their telemetry kept, marked
``extra["replayed"] = True``); every later call goes to the live backend ``then``. Because the agent
loop and the tools are deterministic given the completions, the replayed prefix reproduces the stored
conversation as long as the environment answers the same (check ``TurnRecord.observation`` against the
stored turns if that matters). The live backend first sees a conversation it did not generate; a stateful
backend (hf under true eviction) must prefill all of it on that first call.
"""

from __future__ import annotations

from agent_runner.backends import Model
from agent_runner.records import Completion, Message


class ReplayModel:
    """Recorded completions (strings or Completions) first, then the live backend ``then``."""

    def __init__(self, recorded: list[str | Completion], then: Model) -> None:
        self.recorded = [c if isinstance(c, Completion) else Completion(text=c) for c in recorded]
        self.then = then
        self._next = 0

    def reset(self, *, seed: int) -> None:
        self._next = 0
        self.then.reset(seed=seed)

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        if self._next < len(self.recorded):
            recorded = self.recorded[self._next]
            self._next += 1
            return recorded.model_copy(update={"extra": {**recorded.extra, "replayed": True}})
        return self.then.complete(messages, max_new_tokens=max_new_tokens)

    def retention(self) -> dict | None:
        """The live backend's final cache (None when it keeps none or every turn was replayed)."""
        read = getattr(self.then, "retention", None)
        return read() if read is not None else None
