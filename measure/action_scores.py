"""Action scores: how well a model still predicts the parts of an agent's calls, span by span.

A replayed assistant turn is split into spans (``measure.action_spans``): the function name, parameter
names, and parameter values, each value either a **copy** (it repeats, verbatim, text of an earlier
observation: an ``old_str`` copied from a view, a path, a test id) or **new** (``new_str``, a command).
Copies are what an evicting cache can break outright: the edit fails unless every character is repeated.

Per span (``SpanScore``), over the span's tokens (a token counts for a span when its characters overlap it):

  nll, top1     mean -log p and top-1 agreement over the tokens **after the span's first**: the first token
                says *what* to copy (a choice the context may not determine); the rest say whether the model
                can still read the source. ``None`` for a one-token span.
  first_top1    whether the span's first token was the argmax.
  exact         greedy-exact: every token of the span, the first included, was the argmax.

For a copy span also where its source was (``source``: the user message, 0 = the task; ``back``: tokens from
the source's last token to the copy's first token) and, per layer, the share of the source's (KV head,
position) entries the cache still held when the copy began (``held``: the cache the copy's first token was
predicted from; under prefill_decode a decode-time eviction before it counts).

``ActionSummary`` pools an episode's spans by kind: tokens, spans, and the token-weighted means above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel

from agent_runner.chat_stream import RenderedTrajectory
from measure.action_spans import Span, action_spans

KINDS = ("function", "param", "copy", "new")


@dataclass(frozen=True)
class PlannedSpan:
    """A span of one rendered turn, in tokens: generated[first:last] covers it; ``source``: the copied text's
    positions [start, end) in this turn's context (copy spans)."""

    span: Span
    first: int
    last: int
    source: tuple[int, int] | None = None


class SpanScore(BaseModel):
    kind: str
    function: str
    param: str | None = None
    start: int  # characters of the assistant text
    end: int
    tokens: int
    nll: float | None = None  # over the tokens after the first
    top1: float | None = None
    first_top1: bool
    exact: bool
    source: int | None = None  # copy spans: the user message the source is in
    back: int | None = None  # tokens from the source's last token to the copy's first
    source_tokens: int | None = None
    held: list[float] | None = None  # per layer: share of the source's entries held when the copy began
    held_mean: float | None = None


class ActionSummary(BaseModel):
    """One replay's spans pooled by kind (token-weighted over the tokens after each span's first)."""

    spans: dict[str, int]
    tokens: dict[str, int]  # scored tokens (after each span's first)
    nll: dict[str, float | None]
    top1: dict[str, float | None]
    exact: dict[str, float | None]  # share of spans that were greedy-exact
    copy_held: float | None = None  # mean over copy spans of held_mean


def plan_spans(rendered: RenderedTrajectory) -> list[list[PlannedSpan]]:
    """The spans of every rendered turn, placed on its generated tokens and its context."""
    out: list[list[PlannedSpan]] = []
    for t, (text, layout) in enumerate(zip(rendered.assistant, rendered.layouts, strict=True)):
        planned = []
        for span in action_spans(text, rendered.observations[: t + 1]):
            covering = [j for j, (a, b) in enumerate(layout.offsets) if a < span.end and b > span.start]
            if not covering:
                continue
            source = None
            if span.kind == "copy" and span.source is not None:
                source = layout.positions(span.source, span.source_start, span.source_end)
            planned.append(PlannedSpan(span, covering[0], covering[-1] + 1, source))
        out.append(planned)
    return out


def snapshot_points(planned: Sequence[PlannedSpan]) -> list[int]:
    """Generated-token indices at which a copy begins (the cache is read just before predicting them)."""
    return sorted({p.first for p in planned if p.source is not None})


def held_share(cache, start: int, end: int) -> list[float]:
    """Per layer, the share of (KV head, position) entries of positions [start, end) that ``cache`` holds."""
    shares = []
    for layer in range(cache.num_layers):
        pos = cache.retained_positions(layer)  # [B, Hkv, P]
        heads = pos.shape[1] if pos.dim() == 3 and pos.shape[0] else 0
        if not heads or end <= start:
            shares.append(0.0)
            continue
        inside = ((pos[0] >= start) & (pos[0] < end)).sum().item()
        shares.append(round(inside / (heads * (end - start)), 4))
    return shares


def score_spans(
    planned: Sequence[PlannedSpan],
    nll: torch.Tensor,
    top1: torch.Tensor,
    context: int,
    held: dict[int, list[float]],
) -> list[SpanScore]:
    """Scores of one turn's spans from its per-token ``nll`` and ``top1`` ([n] over generated tokens);
    ``held[first]``: per layer, the share of the source of the copy beginning at generated token ``first``
    that the cache held when that token was predicted (``held_share``, read at ``snapshot_points``)."""
    scores = []
    for p in planned:
        tail_nll, tail_top1 = nll[p.first + 1 : p.last], top1[p.first + 1 : p.last]
        score = SpanScore(
            kind=p.span.kind,
            function=p.span.function,
            param=p.span.param,
            start=p.span.start,
            end=p.span.end,
            tokens=p.last - p.first,
            nll=float(tail_nll.mean()) if len(tail_nll) else None,
            top1=float(tail_top1.float().mean()) if len(tail_top1) else None,
            first_top1=bool(top1[p.first]),
            exact=bool(top1[p.first : p.last].all()),
            source=p.span.source if p.span.kind == "copy" else None,
        )
        if p.source is not None:
            start, end = p.source
            score.back = context + p.first - end
            score.source_tokens = end - start
            score.held = held.get(p.first)
            if score.held:
                score.held_mean = sum(score.held) / len(score.held)
        scores.append(score)
    return scores


def summarize(spans: Sequence[SpanScore]) -> ActionSummary:
    """Pool ``spans`` (one replay's, every turn) by kind."""
    out = ActionSummary(spans={}, tokens={}, nll={}, top1={}, exact={})
    for kind in KINDS:
        mine = [s for s in spans if s.kind == kind]
        scored = [s for s in mine if s.nll is not None]
        n = sum(s.tokens - 1 for s in scored)
        out.spans[kind], out.tokens[kind] = len(mine), n
        out.nll[kind] = sum(s.nll * (s.tokens - 1) for s in scored) / n if n else None
        out.top1[kind] = sum(s.top1 * (s.tokens - 1) for s in scored) / n if n else None
        out.exact[kind] = sum(s.exact for s in mine) / len(mine) if mine else None
    held = [s.held_mean for s in spans if s.kind == "copy" and s.held_mean is not None]
    out.copy_held = sum(held) / len(held) if held else None
    return out
