"""StreamingLLM: attention sinks plus a recency window (Xiao et al., "Efficient Streaming Language Models
with Attention Sinks").

Per KV head the policy keeps the `n_sink` valid slots with the lowest logical positions (the attention
sinks; positions 0..n_sink-1 once the stream is that long) and the `budget - n_sink` valid slots with the
highest logical positions. Nothing is scored from attention, so the cache need not keep queries
(`needs_queries = False`); every head keeps the same logical positions.

Scopes: under `prefill_only` it is the one-shot prefill compression of kvpress / KVCache-Factory / AdaKV;
under `prefill_decode` it is the rolling StreamingLLM with a fixed-size cache (evicted back to the budget
whenever a layer reaches budget + slack).

Deliberate difference from the paper: the paper re-assigns positions *inside the cache* (the kept keys are
re-rotated to contiguous positions 0..C-1, "position rolling"). We keep every token's original RoPE
position, as the cached keys are stored post-RoPE and the other methods here do the same; this matches
the prefill-only reference implementations (kvpress `StreamingLLMPress` without `KeyRerotationPress`,
KVCache-Factory, AdaKV) but not the paper's streaming demo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from nexus.methods import register
from nexus.policies.base import LayerView, Policy, check_int, keep_top, oldest_slots


@register("streaming_llm", order=7)
@dataclass(frozen=True)
class StreamingLLM(Policy):
    """Keep `n_sink` sinks + the most recent `budget - n_sink` tokens per KV head.

    n_sink: number of attention-sink tokens (the paper's and every reference's default: 4).
    The window W of `EvictionConfig` is not used: the recency part is the whole rest of the budget.
    """

    name: ClassVar[str] = "streaming_llm"
    needs_queries: ClassVar[bool] = False

    n_sink: int = 4

    def __post_init__(self) -> None:
        check_int(self.name, "n_sink", self.n_sink, 0)

    def min_budget(self, window: int, block_size: int) -> int:
        return self.n_sink + 1

    def select(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, min(budget, P)] ascending slot indices, -1 padded where a head has fewer valid slots."""
        sinks = oldest_slots(view.positions, min(self.n_sink, view.budget))
        # Recency as the score: the top (budget - n_sink) non-sink slots by logical position are the newest.
        # float32 represents positions exactly up to 2**24 (16M tokens), far beyond any context here.
        recency = view.positions.float()
        return keep_top(recency, sinks, view.valid, view.budget)
