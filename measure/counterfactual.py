"""Counterfactual replay: teacher-force a stored trajectory through a cache managed by another method.

A full episode costs thousands of decode steps. "How much does method X hurt this agent?" can often be
answered far more cheaply: feed the exact token stream a dense run produced (its prompts, observations and
completions) through an `EvictableCache` under X, and measure how well the model still predicts its own
completion tokens (mean negative log-likelihood, top-1 agreement) turn by turn.

The stored stream (one `TurnTokens` per turn, see `agent_runner.backends.hf`): the context the model
conditioned on at turn t is `previous[:keep] + append`, where `previous` is turn t-1's context followed by the
completion tokens that were fed back (every generated token but the last, which the next turn's feed opens
with). Under true eviction `keep` is always the whole previous stream; a full-context run re-renders the
history, so `keep` stops where the re-rendering first differs.

Turn segments (``nexus.segments``): a caller that knows the tokenizer gives each turn's cache the segments of the
turn's context (``turn_segments``: its ChatML messages) before the forward that feeds them, as the hf backend
does live, so a method that reads them (``observation_masking``, ``candidates: newest_turn``) decides as it would
in the episode; without them every position is ``other``.

Protocols of the replay:
  true_eviction  one cache for the whole stream: turn 0's context is prefilled, each later turn's `append` is
                 prefilled onto it (requires a stream that only ever appends), completions are decoded.
  full_context   every turn starts a fresh cache and prefills that turn's whole context, then decodes.

Speed: completion tokens are fed in chunks under `EvictableCache.decoding()`, not one by one. Under
prefill_decode a chunk ends exactly where the next decode-time eviction fires (`EvictableCache.decode_chunk`), so every
eviction sees the same cache as token-by-token teacher forcing and the logits are the same (tested in fp64).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from pydantic import BaseModel

import nexus
from agent_runner.chat_segments import ChatMarkers, chat_segments
from agent_runner.config import check_protocol
from agent_runner.records import LayerStats, TurnTokens
from measure.action_scores import (
    ActionSummary,
    PlannedSpan,
    SpanScore,
    held_share,
    score_spans,
    snapshot_points,
    summarize,
)
from nexus.segments import Segment

#: chunks are capped so the [chunk, vocab] logits stay small (any split between events is exact)
MAX_CHUNK = 256


class ReplayError(ValueError):
    """The stored stream cannot be replayed as asked (say why)."""


class TurnScore(BaseModel):
    """One replayed turn. The KV memory figures (`nexus.memory`): held and allocated bytes after the turn, and
    the largest of each during it (from before its prefill to its end, the prefill's pre-eviction state
    included)."""

    index: int
    tokens: int  # completion tokens scored
    nll_mean: float | None = None  # mean -log p(stored token)
    top1: float | None = None  # share of stored tokens that were the model's argmax
    eviction_events: int = 0
    physical_after: LayerStats | None = None
    kv_held_bytes: int = 0
    kv_allocated_bytes: int = 0
    kv_peak_held_bytes: int = 0
    kv_peak_allocated_bytes: int = 0
    chunks: int = 0  # forwards spent on the completion
    seconds: float = 0.0
    spans: list[SpanScore] | None = None  # the call's spans (a replay of a text trajectory; action_scores)


class ReplayScore(BaseModel):
    method: str
    scope: str
    protocol: str
    chunked: bool = True
    turns: list[TurnScore]
    tokens: int = 0
    nll_mean: float | None = None  # over every scored token of the episode
    top1: float | None = None
    action: ActionSummary | None = None  # the spans pooled by kind (a replay of a text trajectory)
    seconds: float = 0.0


def contexts(turns: list[TurnTokens]) -> list[list[int]]:
    """The full context of every turn (what the model conditioned on), rebuilt from the stored increments."""
    out: list[list[int]] = []
    previous: list[int] = []
    for t, turn in enumerate(turns):
        if turn.keep > len(previous):
            raise ReplayError(f"turn {t} keeps {turn.keep} tokens but the stream before it has {len(previous)}")
        ctx = previous[: turn.keep] + list(turn.append)
        out.append(ctx)
        previous = ctx + list(turn.generated[:-1])
    return out


def turn_segments(turns: list[TurnTokens], markers: ChatMarkers) -> list[tuple[Segment, ...]]:
    """Each turn's context as ``nexus.segments`` (its ChatML messages; the last, the assistant header, left open so
    the turn's generated tokens join it): what the cache is told before the forward that feeds the turn."""
    return [chat_segments(ctx, markers) for ctx in contexts(turns)]


def read_index(j: int) -> int:
    """The feed index before which the cache predicting generated token j is read (see ``teacher_force``)."""
    return max(j - 1, 0)


Forward = Callable[[nexus.EvictableCache, list[int], bool], torch.Tensor]


def model_forward(model: torch.nn.Module, device: torch.device) -> Forward:
    """forward(cache, ids, all_logits) -> logits [n, V] for every fed position (or [1, V] for the last)."""
    kw = nexus.cache_kwarg(model)

    @torch.no_grad()
    def forward(cache: nexus.EvictableCache, ids: list[int], all_logits: bool) -> torch.Tensor:
        x = torch.as_tensor(ids, dtype=torch.long, device=device).view(1, -1)
        out = model(input_ids=x, use_cache=True, logits_to_keep=0 if all_logits else 1, **{kw: cache})
        return out.logits[0]

    return forward


def teacher_force(
    forward: Forward,
    model_config,
    turns: list[TurnTokens],
    eviction: nexus.EvictionConfig,
    protocol: str,
    *,
    chunked: bool = True,
    marks: Mapping[int, Sequence[int]] | None = None,
    snapshot: Callable[[int, int, nexus.EvictableCache], None] | None = None,
    segments: Sequence[Sequence[Segment]] | None = None,
) -> Iterator[tuple[int, nexus.EvictableCache, torch.Tensor, list[int], int]]:
    """Yield (turn index, cache, logits [n, V], the n stored tokens they predict, forwards) per turn.

    ``segments[t]``: turn t's context as ``nexus.segments`` (``turn_segments``), given to the cache before the
    forward that feeds it (None: the cache is told nothing, every position is ``other``).
    ``marks[t]``: generated-token indices j of turn t whose predicting cache ``snapshot(t, read_index(j), cache)``
    reads: the cache after the prefill for j <= 1, else just before generated[j - 1] is fed (a chunk never
    spans a mark, and any split between eviction events is exact)."""
    try:
        check_protocol(protocol)
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    ctxs = contexts(turns)
    cache, fed = None, 0
    for t, turn in enumerate(turns):
        if not turn.generated:  # a turn that stopped before generating (context full): nothing to score
            continue
        if cache is None or protocol == "full_context":
            cache, feed = nexus.EvictableCache(model_config, eviction), ctxs[t]
        else:
            if turn.keep != fed:
                raise ReplayError(
                    f"turn {t} re-renders the history (keeps {turn.keep} of {fed} tokens): its stream is not a "
                    "continuation, so it cannot be replayed under true_eviction; replay it under full_context"
                )
            feed = list(turn.append)
        if segments is not None:
            cache.segments = segments[t]  # before the prefill: its event reads them
        cache.reset_peaks()  # the turn's peaks, from before its prefill
        first = forward(cache, feed, False)  # the prompt's last position predicts the first token
        logits, forwards = decode_rest(
            forward, cache, first, turn.generated, (marks or {}).get(t, ()), chunked, t, snapshot
        )
        fed = len(ctxs[t]) + len(turn.generated) - 1
        yield t, cache, logits, list(turn.generated), forwards


def decode_rest(
    forward: Forward,
    cache: nexus.EvictableCache,
    first: torch.Tensor,
    generated: list[int],
    marks: Sequence[int],
    chunked: bool,
    t: int,
    snapshot: Callable[[int, int, nexus.EvictableCache], None] | None,
) -> tuple[torch.Tensor, int]:
    """Feed a turn's stored tokens back after its prompt (whose last logits are ``first`` [1, V]): logits [n, V]
    for the n generated tokens, and the forwards spent (the prompt's included). See ``teacher_force``."""
    logits, forwards = [first], 1
    rest = list(generated[:-1])  # fed back as decoded tokens; the last one opens the next feed
    # feed index i (rest[i] = generated[i]) is where the cache predicting generated[i + 1] is read
    reads = sorted({read_index(j) for j in marks})
    at = 0
    with cache.decoding():
        while rest:
            if reads and reads[0] == at:
                snapshot(t, reads.pop(0), cache)
            n = min(cache.decode_chunk(len(rest)), MAX_CHUNK) if chunked else 1
            if reads:
                n = min(n, reads[0] - at)
            logits.append(forward(cache, rest[:n], True))
            rest, forwards, at = rest[n:], forwards + 1, at + n
    return torch.cat(logits), forwards


def token_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(-log p, argmax == target) per position of `logits` [..., n, V] for `targets` [n]: fp32 at least (bf16
    logits are too coarse for an NLL), never a copy to fp64 of [n, vocab]; top1 as float64."""
    logp = torch.log_softmax(logits if logits.dtype in (torch.float32, torch.float64) else logits.float(), dim=-1)
    wanted = targets.expand(*logits.shape[:-1]).unsqueeze(-1)
    nll = -logp.gather(-1, wanted).squeeze(-1)
    return nll, (logits.argmax(dim=-1) == targets).double()


class Scorer:
    """Accumulates one replay's ``TurnScore``s (and, with ``actions``, its span scores) turn by turn."""

    def __init__(
        self,
        eviction: nexus.EvictionConfig,
        protocol: str,
        turns: list[TurnTokens],
        chunked: bool,
        actions: Sequence[Sequence[PlannedSpan]] | None,
    ):
        self.eviction, self.protocol, self.chunked, self.actions = eviction, protocol, chunked, actions
        self.scores: list[TurnScore] = []
        self.events = 0
        self.started = time.perf_counter()
        self.held: dict[tuple[int, int], list[float]] = {}  # (turn, generated index of a copy's start) -> per layer
        self.context_lengths = [len(c) for c in contexts(turns)] if actions is not None else []
        # per turn, the generated indices at which a copy begins (where the cache is read)
        self.marks = {t: snapshot_points(p) for t, p in enumerate(actions)} if actions is not None else None

    def snapshot(self, t: int, at: int, cache: nexus.EvictableCache) -> None:
        """Read, from ``cache``, the held share of the source of every copy of turn t read at feed index ``at``."""
        for p in self.actions[t]:
            if p.source is not None and read_index(p.first) == at:
                self.held[t, p.first] = held_share(cache, *p.source)

    def turn(self, t: int, cache, logits: torch.Tensor, targets: list[int], forwards: int, start: float) -> None:
        nll, top1 = token_scores(logits, torch.as_tensor(targets, device=logits.device))
        self.scored(t, cache, nll, top1, forwards, time.perf_counter() - start)

    def scored(self, t: int, cache, nll: torch.Tensor, top1: torch.Tensor, forwards: int, seconds: float) -> None:
        """Turn t's score from its per-token ``nll`` and ``top1`` ([n]) and the cache it ended with."""
        if self.protocol == "full_context":
            self.events = 0
        score = TurnScore(
            index=t,
            tokens=len(nll),
            nll_mean=float(nll.mean()),
            top1=float(top1.mean()),
            eviction_events=len(cache.events) - self.events,
            physical_after=LayerStats.of([cache.occupancy(i) for i in range(cache.num_layers)]),
            **dataclasses.asdict(cache.memory()),
            chunks=forwards - 1,
            seconds=seconds,
        )
        if self.actions is not None:
            mine = {j: share for (u, j), share in self.held.items() if u == t}
            score.spans = score_spans(self.actions[t], nll, top1, self.context_lengths[t], mine)
        self.scores.append(score)
        self.events = len(cache.events)

    def result(self) -> ReplayScore:
        scores = self.scores
        tokens = sum(s.tokens for s in scores)
        return ReplayScore(
            method=self.eviction.method,
            scope=self.eviction.scope,
            protocol=self.protocol,
            chunked=self.chunked,
            turns=scores,
            tokens=tokens,
            nll_mean=sum(s.nll_mean * s.tokens for s in scores) / tokens if tokens else None,
            top1=sum(s.top1 * s.tokens for s in scores) / tokens if tokens else None,
            action=summarize([x for s in scores for x in s.spans or ()]) if self.actions is not None else None,
            seconds=time.perf_counter() - self.started,
        )


def replay_episode(
    forward: Forward,
    model_config,
    turns: list[TurnTokens],
    eviction: nexus.EvictionConfig,
    protocol: str,
    *,
    chunked: bool = True,
    actions: Sequence[Sequence[PlannedSpan]] | None = None,
    segments: Sequence[Sequence[Segment]] | None = None,
) -> ReplayScore:
    """Score one stored trajectory under `eviction` and `protocol` (see the module docstring). ``actions``: the
    spans of each turn's call (``measure.action_scores.plan_spans``), scored span by span too. ``segments``: each
    turn's context as ``nexus.segments`` (``turn_segments``; None: none, as a host without a tokenizer)."""
    scorer = Scorer(eviction, protocol, turns, chunked, actions)
    stream = teacher_force(
        forward, model_config, turns, eviction, protocol, chunked=chunked, marks=scorer.marks,
        snapshot=scorer.snapshot, segments=segments,
    )  # fmt: skip
    while True:
        start = time.perf_counter()
        try:
            t, cache, logits, targets, forwards = next(stream)
        except StopIteration:
            break
        scorer.turn(t, cache, logits, targets, forwards, start)
    return scorer.result()
