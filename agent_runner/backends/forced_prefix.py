"""ForcedPrefix: an episode whose first turns are a stored attempt's (``nexus-eval rerun --from-turn K``).

The first ``len(recorded)`` calls reproduce the stored turns through the live backend, then every call is the
live backend's own. A stored turn is its completion text and, when the backend reported one (hf), its token
stream (``TurnTokens``: keep, append, generated; ``db.models.Turn.tokens``). How a stored turn is forced, best
first (``ForcedPrefix.how`` per turn, ``Completion.info.forced_from`` on each forced completion):

  ids      the live backend takes ``forced_ids`` (hf) and the turn has its ``generated`` ids: exactly those ids
           are fed, token by token, so the cache is rebuilt as the stored run built it (decode-time evictions
           included) and the backend's generator draws as it did, so the turns sampled after the prefix continue
           its random stream. The rebuilt stream's keep/append are checked against the stored ones.
  text     the backend takes ``forced_text`` only, or the row has no ids (stored before they were kept): the
           text is re-tokenised and fed. A sampled sequence is often not the tokenizer's own encoding of its
           text, so the cache may differ from the stored run's.
  stepped  the backend cannot teacher-force (scripted, openai): it is stepped (its own state, a script
           position, advances) and its text replaced by the stored one.

Every forced completion's text is the stored text: it is what the stored run's agent parsed and acted on, so the
agent loop and the tools (deterministic given the completions) reproduce the stored conversation as long as the
environment answers the same. Anything that keeps the rebuild from being exact (no ids, another decode of the
ids, a stream that differs from the stored one) is a line in ``ForcedPrefix.notes``, logged as a warning.

Each forced completion is marked ``Completion.forced``. (Counterfactual *replay*, ``nexus-eval replay``, is a
different thing: a dense episode's token stream scored under another method's cache; measure/counterfactual.py.)
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_runner.backends import Model
from agent_runner.records import Completion, ForcedFrom, Message, TurnTokens

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredTurn:
    """One stored turn to force: its completion text and its token stream (None: the backend kept none)."""

    text: str
    tokens: TurnTokens | None = None

    @classmethod
    def of(cls, item: str | StoredTurn | tuple[str, TurnTokens | dict[str, Any] | None]) -> StoredTurn:
        """A text, a StoredTurn, or ``(text, tokens)`` as a ``db.models.Turn`` row holds them."""
        if isinstance(item, StoredTurn):
            return item
        if isinstance(item, str):
            return cls(item)
        text, tokens = item
        return cls(text, TurnTokens.model_validate(tokens) if tokens is not None else None)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class ForcedPrefix:
    """Stored turns first, forced through ``live`` (by their token ids where it can); then ``live`` itself.

    ``recorded``: one item per stored turn, a text or ``(text, tokens)`` (``StoredTurn.of``). ``notes`` lists,
    one line per case, every forced turn whose rebuild may not be exact; ``how[i]`` is how turn i is forced."""

    def __init__(self, recorded: Sequence[str | StoredTurn | tuple], live: Model) -> None:
        self.recorded, self.live, self._next = [StoredTurn.of(item) for item in recorded], live, 0
        params = inspect.signature(live.complete).parameters
        self.teacher_forces = "forced_text" in params
        self.forces_ids = "forced_ids" in params
        self.how: list[ForcedFrom] = []
        for stored in self.recorded:
            if self.forces_ids and stored.tokens is not None:  # (empty `generated`: the window was full)
                self.how.append("ids")
            else:
                self.how.append("text" if self.teacher_forces else "stepped")
        self.notes: list[str] = []
        self._diverged = False  # the rebuilt stream left the stored one (noted once)
        if self.forces_ids:
            for i, how in enumerate(self.how):
                if how == "text":
                    self._note(f"turn {i}: no stored token ids; re-tokenized the text, the cache may differ")
        elif self.recorded and any(s.tokens is not None for s in self.recorded):
            kind = "re-tokenizes the texts" if self.teacher_forces else "cannot teacher-force: its cache is its own"
            self._note(f"the live backend ({type(live).__name__}) takes no token ids and {kind}")

    def _note(self, line: str) -> None:
        self.notes.append(line)
        log.warning("rerun --from-turn: %s", line)

    def reset(self, *, seed: int) -> None:
        self._next = 0
        self.live.reset(seed=seed)

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        if self._next >= len(self.recorded):
            return self.live.complete(messages, max_new_tokens=max_new_tokens)
        index, stored, how = self._next, self.recorded[self._next], self.how[self._next]
        self._next += 1
        if how == "ids":
            ids = list(stored.tokens.generated)
            done = self.live.complete(messages, max_new_tokens=max_new_tokens, forced_ids=ids)  # type: ignore[call-arg]
            self._check(index, stored, done)
        elif how == "text":
            done = self.live.complete(messages, max_new_tokens=max_new_tokens, forced_text=stored.text)  # type: ignore[call-arg]
        else:  # step the backend so its own state advances, keep the stored text
            done = self.live.complete(messages, max_new_tokens=max_new_tokens)
        info = done.info.model_copy(update={"forced_from": how})
        return done.model_copy(update={"text": stored.text, "forced": True, "info": info})

    def retention(self) -> dict | None:
        """The live backend's final cache (None when it keeps none)."""
        read = getattr(self.live, "retention", None)
        return read() if read is not None else None

    def _check(self, index: int, stored: StoredTurn, done: Completion) -> None:
        """Note where the rebuilt turn is not the stored one: its context (keep/append) or its text."""
        want, got = stored.tokens, done.tokens
        if got is None:
            return
        if not self._diverged and (got.keep, got.append) != (want.keep, want.append):
            self._diverged = True
            at = _first_difference(got.append, want.append)
            self._note(
                f"turn {index}: the rebuilt context differs from the stored one (keep {got.keep} vs {want.keep}, "
                f"appended tokens differ from position {at} of {len(want.append)}: the environment answered "
                "differently, or the history was edited); the cache differs from this turn on"
            )
        if done.context_full and want.generated:
            self._note(f"turn {index}: the context window was full; the stored turn's ids were not fed")
        elif done.text != stored.text:
            self._note(
                f"turn {index}: the stored ids decode to another text than the stored completion (another "
                "tokenizer?); the cache holds the ids, the agent gets the stored text"
            )
