"""ForcedPrefix: an episode whose first turns are a stored attempt's (``nexus-eval rerun --from-turn K``).

The first ``len(recorded)`` calls reproduce the stored completions through the live backend, then every call
is the live backend's own. When the live backend can teacher-force a text (the hf backend's ``forced_text``)
the stored completion is fed through it, so its cache holds what it would hold had it generated that text;
otherwise the backend is stepped (its own state, a script position, advances) and its text replaced by the
stored one. Because the agent loop and the tools are deterministic given the completions, the forced prefix
reproduces the stored conversation as long as the environment answers the same.

Each forced completion is marked ``Completion.forced``. (Counterfactual *replay*, ``nexus-eval replay``, is a
different thing: a dense episode's token stream scored under another method's cache; agent_runner/counterfactual.py.)
"""

from __future__ import annotations

import inspect

from agent_runner.backends import Model
from agent_runner.records import Completion, Message


class ForcedPrefix:
    """Stored completion texts first, forced through ``live``; then ``live`` itself."""

    def __init__(self, recorded: list[str], live: Model) -> None:
        self.recorded, self.live, self._next = list(recorded), live, 0
        self.teacher_forces = "forced_text" in inspect.signature(live.complete).parameters

    def reset(self, *, seed: int) -> None:
        self._next = 0
        self.live.reset(seed=seed)

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        if self._next >= len(self.recorded):
            return self.live.complete(messages, max_new_tokens=max_new_tokens)
        text = self.recorded[self._next]
        self._next += 1
        if self.teacher_forces:
            done = self.live.complete(messages, max_new_tokens=max_new_tokens, forced_text=text)  # type: ignore[call-arg]
        else:  # step the backend so its own state advances, keep the stored text
            done = self.live.complete(messages, max_new_tokens=max_new_tokens).model_copy(update={"text": text})
        return done.model_copy(update={"forced": True})

    def retention(self) -> dict | None:
        """The live backend's final cache (None when it keeps none)."""
        read = getattr(self.live, "retention", None)
        return read() if read is not None else None
