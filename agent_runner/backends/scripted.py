"""ScriptedModel: a test double that replays a fixed list of completions.

It stands in for the model's choices (outside our control) in loop tests and demos. Each ``complete``
returns the next scripted item; a string becomes a :class:`Completion` whose token counts are
whitespace-word counts (so context limits can be exercised without a tokenizer). Every conversation it
was shown is kept in ``calls`` for assertions. Running past the script raises :class:`ModelError`.
"""

from __future__ import annotations

from agent_runner.backends import ModelError
from agent_runner.records import Completion, Message


def _words(messages: list[Message]) -> int:
    return sum(len(m.content.split()) for m in messages)


class ScriptedModel:
    """Test double: replays ``script`` (strings or ready-made Completions) one per call."""

    def __init__(self, script: list[str | Completion]) -> None:
        if not isinstance(script, list):
            raise ValueError(f"ScriptedModel: script must be a list of strings or Completions, got {type(script)}")
        self.script = list(script)
        self.calls: list[list[Message]] = []
        self.max_new_tokens_seen: list[int | None] = []
        self.seed: int | None = None
        self._next = 0
        self._last_logical = 0

    def reset(self, *, seed: int) -> None:
        self.seed = seed
        self.calls = []
        self.max_new_tokens_seen = []
        self._next = 0
        self._last_logical = 0

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        if self._next >= len(self.script):
            raise ModelError(f"ScriptedModel: script exhausted after {len(self.script)} completions")
        self.calls.append(list(messages))
        self.max_new_tokens_seen.append(max_new_tokens)
        item = self.script[self._next]
        self._next += 1
        if isinstance(item, Completion):
            return item
        prompt = _words(messages)
        generated = len(item.split())
        completion = Completion(
            text=item,
            tokens_generated=generated,
            prompt_tokens=prompt,
            tokens_appended=max(prompt - self._last_logical, 0),
            logical_length=prompt + generated,
            finish_reason="stop",
        )
        self._last_logical = completion.logical_length
        return completion
