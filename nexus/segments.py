"""Turn segments: what each stretch of a conversation's logical positions is, as data any policy may read.

A host that knows the layout of what it feeds (the hf backend and the replays: ``agent_runner.chat_segments``)
sets ``EvictableCache.segments`` before a forward; an eviction event hands them to the policy in
``LayerView.segments``. A policy that reads them (``observation_masking``) or the ``candidates: newest_turn``
setting (``nexus.cache``) decides by them; every other policy ignores them. A cache nobody told anything holds
no segments: every position is then of kind ``other``.

Kinds, in the order of a ChatML conversation:
  prompt       the system message (instructions, tools)
  task         the first user message (the issue the agent works on)
  assistant    an assistant turn: its header, what the model generated, its close
  observation  a later user message: what a tool returned
  masked       an observation the host already replaced by a placeholder at the text level (full context under
               ``observation_masking``): it is part of the context, but not an observation any more
  other        anything no segment covers

The last segment is open-ended (``end`` None): tokens decoded after it was set (an assistant turn being generated)
belong to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS: tuple[str, ...] = ("prompt", "task", "assistant", "observation", "masked", "other")


@dataclass(frozen=True)
class Segment:
    """Logical positions [start, end) of one message; ``end`` None: up to the end of the stream."""

    start: int
    end: int | None
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"segment kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"a segment spans [start, end) with 0 <= start <= end, got [{self.start}, {self.end})")

    def stop(self, length: int) -> int:
        """``end``, or ``length`` for the open-ended last segment."""
        return length if self.end is None else min(self.end, length)


def check_segments(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """``segments`` as a tuple, ValueError unless they are in order and do not overlap (only the last may be
    open-ended)."""
    out = tuple(segments)
    for a, b in zip(out, out[1:], strict=False):
        if a.end is None or b.start < a.end:
            raise ValueError(f"segments must be in order and not overlap: {a} then {b}")
    return out


def observations(segments: Sequence[Segment]) -> list[Segment]:
    """The observation segments, oldest first."""
    return [s for s in segments if s.kind == "observation"]


def masked_observations(segments: Sequence[Segment], keep_latest: int) -> list[Segment]:
    """The observations older than the newest ``keep_latest`` (what the paper's masking rule drops)."""
    seen = observations(segments)
    return seen[: max(len(seen) - keep_latest, 0)]
