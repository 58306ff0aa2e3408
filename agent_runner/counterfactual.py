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
from collections.abc import Callable, Iterator

import torch
from pydantic import BaseModel

import nexus
from agent_runner.config import check_protocol
from agent_runner.records import LayerStats, TurnTokens

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


class ReplayScore(BaseModel):
    method: str
    scope: str
    protocol: str
    chunked: bool = True
    turns: list[TurnScore]
    tokens: int = 0
    nll_mean: float | None = None  # over every scored token of the episode
    top1: float | None = None
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
) -> Iterator[tuple[int, nexus.EvictableCache, torch.Tensor, list[int], int]]:
    """Yield (turn index, cache, logits [n, V], the n stored tokens they predict, forwards) per turn."""
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
        cache.reset_peaks()  # the turn's peaks, from before its prefill
        logits = [forward(cache, feed, False)]  # the prompt's last position predicts the first token
        forwards = 1
        rest = list(turn.generated[:-1])  # fed back as decoded tokens; the last one opens the next feed
        with cache.decoding():
            while rest:
                n = min(cache.decode_chunk(len(rest)), MAX_CHUNK) if chunked else 1
                logits.append(forward(cache, rest[:n], True))
                rest, forwards = rest[n:], forwards + 1
        fed = len(ctxs[t]) + len(turn.generated) - 1
        yield t, cache, torch.cat(logits), list(turn.generated), forwards


def replay_episode(
    forward: Forward,
    model_config,
    turns: list[TurnTokens],
    eviction: nexus.EvictionConfig,
    protocol: str,
    *,
    chunked: bool = True,
) -> ReplayScore:
    """Score one stored trajectory under `eviction` and `protocol` (see the module docstring)."""
    scores: list[TurnScore] = []
    t0 = time.perf_counter()
    events = 0
    stream = teacher_force(forward, model_config, turns, eviction, protocol, chunked=chunked)
    while True:
        start = time.perf_counter()
        try:
            t, cache, logits, targets, forwards = next(stream)
        except StopIteration:
            break
        if protocol == "full_context":
            events = 0
        target = torch.as_tensor(targets, device=logits.device)
        # fp32 at least (bf16 logits are too coarse for an NLL), never a copy to fp64 of [n, vocab]
        logp = torch.log_softmax(logits if logits.dtype in (torch.float32, torch.float64) else logits.float(), dim=-1)
        nll = -logp.gather(1, target.view(-1, 1)).view(-1)
        top1 = (logits.argmax(dim=-1) == target).double()
        scores.append(
            TurnScore(
                index=t,
                tokens=len(targets),
                nll_mean=float(nll.mean()),
                top1=float(top1.mean()),
                eviction_events=len(cache.events) - events,
                physical_after=LayerStats.of([cache.occupancy(i) for i in range(cache.num_layers)]),
                **dataclasses.asdict(cache.memory()),
                chunks=forwards - 1,
                seconds=time.perf_counter() - start,
            )
        )
        events = len(cache.events)
    tokens = sum(s.tokens for s in scores)
    return ReplayScore(
        method=eviction.method,
        scope=eviction.scope,
        protocol=protocol,
        chunked=chunked,
        turns=scores,
        tokens=tokens,
        nll_mean=sum(s.nll_mean * s.tokens for s in scores) / tokens if tokens else None,
        top1=sum(s.top1 * s.tokens for s in scores) / tokens if tokens else None,
        seconds=time.perf_counter() - t0,
    )
