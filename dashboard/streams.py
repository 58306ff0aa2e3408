"""Where each turn sits in an episode's token stream, and where two episodes' generated streams part.

- :func:`turn_starts`: the logical position at which each turn's new tokens begin (the retention map's turn
  marks), and :func:`turn_retention`: how many of each turn's positions the final cache still holds.
- :func:`generated_turn_streams` and :func:`stream_divergence`: the first turn and token where two episodes' generated
  token ids differ (the side-by-side page); by completion text, character by character, when a turn has no
  stored ids (a backend without a token stream).
- :func:`cache_rows`: the two episodes' per-turn cache numbers, side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.charts import retention_counts
from dashboard.list_queries import human_bytes
from db.models import Turn

SNIPPET_IDS = (6, 10)  # token ids shown before / from the first differing one
SNIPPET_CHARS = (60, 100)  # characters shown before / from the first differing one
MARK = "▸"  # where the snippet's streams part


def turn_start(turn: Any, previous: Any | None) -> int:
    """Where ``turn``'s new tokens begin in the episode's logical stream (the fields of
    ``agent_runner.records.Completion`` / ``TurnTokens``, as stored on the turn):

    - its stored stream's ``keep``: the turn's context is the previous stream's first ``keep`` tokens + what it
      appended, under either protocol (a full_context re-render keeps the prefix it shares with the last stream);
    - else ``prompt_tokens - tokens_appended``: the prompt it conditioned on less what it fed new, i.e. the
      previous turn's logical length under true_eviction;
    - a later turn that fed its whole prompt again (full_context, no stored stream): the previous turn's
      ``logical_length``, assuming the re-rendered history reproduces the stream."""
    if turn.keep is not None:
        return int(turn.keep)
    start = turn.prompt_tokens - turn.tokens_appended
    if start <= 0 and previous is not None:
        return previous.logical_length
    return max(0, start)


def turn_starts(turns: Sequence[Any]) -> list[int]:
    return [turn_start(t, turns[i - 1] if i else None) for i, t in enumerate(turns)]


@dataclass
class TurnKept:
    """One turn's positions [start, end) of the final cache's stream and how many of them it still holds."""

    index: int
    start: int
    end: int
    kept: float  # the turn's positions still held, mean over layers and KV heads

    @property
    def tokens(self) -> int:
        return self.end - self.start

    @property
    def share(self) -> float | None:
        return self.kept / self.tokens if self.tokens else None


def turn_retention(retention: dict[str, Any], turns: Sequence[Any]) -> list[TurnKept]:
    """Per turn, its positions in the final cache and how many survive (a turn past the cache's stream, e.g.
    one that found the context full, has none). ``ValueError`` etc. for a malformed map, as the chart."""
    counts = retention_counts(retention)
    length, heads = counts.shape[1], int(retention["kv_heads"])
    held = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])  # positions held so far, over layers and heads
    starts = turn_starts(turns)
    out = []
    for i, turn in enumerate(turns):
        start = min(max(starts[i], 0), length)
        end = min(max(starts[i + 1] if i + 1 < len(starts) else length, start), length)
        out.append(TurnKept(turn.index, start, end, float(held[end] - held[start]) / (counts.shape[0] * heads)))
    return out


# -- two generated streams ---------------------------------------------------------------------------------


@dataclass
class TurnStream:
    index: int
    generated: list[int] | None  # Turn.tokens["generated"]: the ids sampled, the stop token included
    text: str  # the raw completion


def generated_turn_streams(session: Session, episode_id: str) -> list[TurnStream]:
    """The episode's generated ids and completion texts per turn (not the appended ids: only what it sampled)."""
    # the stream is stored packed (db.packing): one episode's, unpacked here
    query = select(Turn.index, Turn.tokens, Turn.completion).where(Turn.episode_id == episode_id).order_by(Turn.index)
    return [
        TurnStream(i, list(stream["generated"]) if stream else None, text or "")
        for i, stream, text in session.execute(query)
    ]


@dataclass
class StreamDivergence:
    basis: str  # "tokens": the stored generated ids; "text": the completion texts, by character
    turn: int | None = None  # the first turn whose streams differ (None: none differ)
    index: int | None = None  # the first differing token (or character) in that turn
    a: str = ""  # each side's snippet at that point (MARK before the first differing item)
    b: str = ""
    a_text: str = ""  # with ids: the turn's completion texts at their first differing character
    b_text: str = ""
    ended: str = ""  # "a" / "b": that side has no such turn

    @property
    def same_text(self) -> bool:
        return self.basis == "tokens" and self.turn is not None and not self.ended and self.a_text == self.b_text


def first_difference(x: Sequence[Any], y: Sequence[Any]) -> int | None:
    """The first index where ``x`` and ``y`` differ (the shorter one's length when one is a prefix of the other)."""
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def _ids(ids: Sequence[int], at: int) -> str:
    before, after = SNIPPET_IDS
    head = "… " if at > before else ""
    tail = " …" if len(ids) > at + after else ""
    left, right = " ".join(map(str, ids[max(0, at - before) : at])), " ".join(map(str, ids[at : at + after]))
    return f"{head}{left} {MARK}{right or '(end)'}{tail}".strip()


def _chars(text: str, at: int) -> str:
    before, after = SNIPPET_CHARS
    head = "…" if at > before else ""
    tail = "…" if len(text) > at + after else ""
    return f"{head}{text[max(0, at - before) : at]}{MARK}{text[at : at + after] or '(end)'}{tail}"


def _snippets(at: int, x: Sequence[Any], y: Sequence[Any], show: Callable[[Any, int], str]) -> tuple[str, str]:
    return show(x, at), show(y, at)


def stream_divergence(a: Sequence[TurnStream], b: Sequence[TurnStream]) -> StreamDivergence:
    """The first turn and token where the generated streams differ, by stored ids when every turn of both has
    them, else by completion text; a trajectory that ended first differs at its next turn's token 0."""
    tokens = all(t.generated is not None for t in (*a, *b))
    basis = "tokens" if tokens else "text"
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):
            ended, there = ("a", b[i]) if i >= len(a) else ("b", a[i])
            shown = _ids(there.generated, 0) if tokens else _chars(there.text, 0)
            gone = f"(ended after {i} turns)"
            return StreamDivergence(basis, i, 0, *((gone, shown) if ended == "a" else (shown, gone)), ended=ended)
        x, y = (a[i].generated, b[i].generated) if tokens else (a[i].text, b[i].text)
        at = first_difference(x, y)
        if at is None:
            continue
        found = StreamDivergence(basis, i, at, *_snippets(at, x, y, _ids if tokens else _chars))
        if tokens:
            char = first_difference(a[i].text, b[i].text)
            found.a_text, found.b_text = ("", "") if char is None else _snippets(char, a[i].text, b[i].text, _chars)
        return found
    return StreamDivergence(basis)


# -- the two caches, turn by turn ---------------------------------------------------------------------------


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _count(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


#: (key, label, value of a TurnView, shown as): the per-turn cache numbers the side-by-side page compares
CACHE_METRICS: tuple[tuple[str, str, Callable[[Any], Any], Callable[[Any], str]], ...] = (
    ("logical", "logical length", lambda t: t.logical_length, _count),
    ("kept", "kept slots after eviction (mean per layer)", lambda t: (t.physical_after or {}).get("mean"), _count),
    ("events", "eviction events", lambda t: t.eviction_events, _count),
    # KV memory (nexus.memory): held and allocated after the turn, and the largest of each during it
    ("kv_held_bytes", "KV held", lambda t: t.kv_held_bytes, human_bytes),
    ("kv_allocated_bytes", "KV alloc", lambda t: t.kv_allocated_bytes, human_bytes),
    ("kv_peak_held_bytes", "KV held peak", lambda t: t.kv_peak_held_bytes, human_bytes),
    ("kv_peak_allocated_bytes", "KV alloc peak", lambda t: t.kv_peak_allocated_bytes, human_bytes),
    ("prefill", "prefill s", lambda t: t.prefill_s, _seconds),
    ("decode", "decode s", lambda t: t.decode_s, _seconds),
)


@dataclass
class CacheCell:
    metric: str
    side: str  # "a" | "b"
    value: Any  # None: the side has no such turn, or the backend reported none
    text: str


def cache_rows(a: Sequence[Any], b: Sequence[Any]) -> list[tuple[int, list[CacheCell]]]:
    """Per turn index, each metric of CACHE_METRICS for A then B ('' / None where a side has no such turn)."""
    rows = []
    for i in range(max(len(a), len(b))):
        cells = []
        for key, _, value_of, show in CACHE_METRICS:
            for side, turns in (("a", a), ("b", b)):
                value = value_of(turns[i]) if i < len(turns) else None
                cells.append(CacheCell(key, side, value, "" if i >= len(turns) else show(value)))
        rows.append((i, cells))
    return rows
