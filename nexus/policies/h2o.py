"""H2O: heavy hitters by accumulated attention (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient
Generative Inference of Large Language Models").

State (per layer, for the whole conversation, on the cache): `view.state["slots"]["acc"]`, [B, Hkv, P]
float32, aligned with the physical slots (the cache gathers it with the kept indices at every event).
With `normalize=True` also `view.state["slots"]["seen"]`, [B, Hkv, P] float32: how many query rows
could see each slot.

`observe` after every forward's attention, with the new queries [B, Hq, q, D] at logical positions [q]:
1. extend acc (and seen) with zeros for the slots appended since the last call (new slots are last);
2. for each chunk of query rows: softmax(q k^T * scaling) over the visible slots in fp32 (causal by
   logical position, empty slots hidden), summed over the rows and over the G query heads of the KV
   group -> [B, Hkv, P], added to acc.
A chunk has at most `chunk_rows` rows and at most `chunk_elements` probabilities (B * Hq * rows * P), so
a 64K prefill never materialises q x P probabilities (at Qwen3-32B's 64 query heads and P = 64K a chunk
is 32 rows, 512 MiB). The chunk size comes from shapes only: no host syncs (decode runs this every step).
Every chunk scores all P slots; the causal mask zeroes the future ones (skipping them would need a sync).

`select`: the most recent `round(recent_ratio * budget)` tokens (round half up) are forced, the rest of
the budget goes to the top remaining slots by acc (or acc / seen with `normalize`).

Deliberate differences and choices:
- KV-head granularity: the original is written for MHA and keeps per-query-head scores; we sum the
  probabilities over the G heads of a group (a sum, like the original's sum over rows; the ranking per
  head equals the mean's) and select per KV head.
- Budget split: the original sets heavy = 0.1 T and recent = 0.1 T (a 20% budget split in half):
  `recent_ratio=0.5` of our single per-head budget reproduces that. KVCache-Factory's H2OKVCluster and
  MorphKV's h2o mode force only the last W (W + 1 there) tokens: `recent_rule="window"` (at 20% of 10K tokens
  that is ~1000 recency slots under "ratio" against W under "window").
- Un-normalised by default, like the original (old tokens are favoured: more queries saw them).
  `normalize=True` divides by the number of queries that could see each slot, as kvpress's
  `ObservedAttentionPress` does (there: T - j for a single prefill). acc sums the G heads of a group
  while seen counts rows once, so the ratio is G x the mean probability: the same ranking.
- When it evicts: the original evicts at every decode step once the cache exceeds heavy + recent; under
  prefill_decode we evict when a layer reaches budget + slack (amortised; the accumulator still sees
  every query). Under prefill_only it is one eviction at the end of each prefill with the method's own
  score: the accumulator over every query seen so far (prefill rows and decoded tokens alike). The
  original's every-step eviction is `slack_blocks=0` (the `reference` preset).
- Positions: every kept key keeps its original RoPE position (keys are cached post-RoPE). The original's
  real-drop streaming class (`H2OLlamaAttention_streaming`) stores un-rotated keys and re-rotates them to
  their cache-slot index every step (StreamingLLM's position rolling); we do not re-rotate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from nexus.methods import register
from nexus.policies.base import (
    LayerView,
    ScorePolicy,
    check_bool,
    check_choice,
    check_int,
    check_number,
    group_queries,
    recent_slots,
    visibility,
)

RECENT_RULES = ("ratio", "window")


def _extended(state: dict, name: str, like: torch.Tensor) -> torch.Tensor:
    """state[name] grown with zeros to `like`'s slot count ([B, Hkv, P] float32, created if absent)."""
    old = state.get(name)
    b, h, p = like.shape
    if old is None:
        return torch.zeros(b, h, p, dtype=torch.float32, device=like.device)
    if old.shape[:2] != (b, h) or old.shape[-1] > p:
        raise ValueError(f"h2o: state['slots'][{name!r}] has shape {tuple(old.shape)}, cache slots {(b, h, p)}")
    if old.shape[-1] == p:
        return old
    return torch.cat([old, old.new_zeros(b, h, p - old.shape[-1])], dim=-1)


@register("h2o", order=5)
@dataclass(frozen=True)
class H2O(ScorePolicy):
    """Heavy hitters (accumulated attention) + a recency window.

    recent_rule:  how many recent tokens are forced: "ratio" (round(recent_ratio * budget), the original's
                  split) or "window" (the last W tokens, KVCache-Factory's H2OKVCluster and MorphKV's h2o mode).
    recent_ratio: under "ratio", the fraction of the per-head budget given to the most recent tokens (0.5 =
                  the original's 0.1 / 0.1 heavy / recent split); the rest goes to the heaviest hitters.
    normalize:    divide the accumulated attention by how many queries could see each slot (kvpress
                  ObservedAttention); False = the original's raw sum.
    chunk_rows:   most query rows processed at once in `observe` (memory only; the result is the same).
    chunk_elements: most probabilities [B, Hq, rows, P] materialised at once in `observe` (fp32 elements).
    """

    name: ClassVar[str] = "h2o"
    needs_queries: ClassVar[bool] = False
    observes: ClassVar[bool] = True
    observe_additive: ClassVar[bool] = True  # acc (and seen) add up over query rows

    recent_rule: str = "ratio"
    recent_ratio: float = 0.5
    normalize: bool = False
    chunk_rows: int = 512
    chunk_elements: int = 2**27

    def __post_init__(self) -> None:
        check_choice(self.name, "recent_rule", self.recent_rule, RECENT_RULES)
        check_number(self.name, "recent_ratio", self.recent_ratio, 0.0, 1.0, hi_open=True)
        check_bool(self.name, "normalize", self.normalize)
        check_int(self.name, "chunk_rows", self.chunk_rows, 1)
        check_int(self.name, "chunk_elements", self.chunk_elements, 1)

    def recent_count(self, budget: int, window: int) -> int:
        """Slots of `budget` forced to the most recent tokens: round half up of recent_ratio * budget
        ("ratio") or the last `window` tokens ("window"), never the whole budget."""
        if self.recent_rule == "window":
            return min(window, budget - 1)
        return int(self.recent_ratio * budget + 0.5)

    def min_budget(self, window: int, block_size: int) -> int:
        if self.recent_rule == "window":
            return window + 1
        budget = 1
        while self.recent_count(budget, window) >= budget:  # terminates: recent_ratio < 1
            budget += 1
        return budget

    def observe(self, view: LayerView, new_queries: torch.Tensor, new_positions: torch.Tensor) -> None:
        """acc += attention of `new_queries` [B, Hq, q, D] (at logical `new_positions` [q]) on every slot."""
        slots = view.state.setdefault("slots", {})
        acc = _extended(slots, "acc", view.positions)
        seen = _extended(slots, "seen", view.positions) if self.normalize else None
        q = group_queries(new_queries, view.num_kv_heads).float()  # [B, Hkv, G, q, D]
        keys = view.keys.float()
        per_row = new_queries.shape[0] * new_queries.shape[1] * max(view.physical_length, 1)
        chunk = max(1, min(self.chunk_rows, self.chunk_elements // per_row))
        for start in range(0, q.shape[3], chunk):
            rows = slice(start, start + chunk)
            vis = visibility(new_positions[rows], view.positions)  # [B, Hkv, r, P]
            logits = torch.einsum("bhgrd,bhpd->bhgrp", q[:, :, :, rows], keys).mul_(view.scaling)
            probs = logits.masked_fill_(~vis.unsqueeze(2), float("-inf")).softmax(dim=-1)
            acc = acc + probs.nan_to_num_(0.0).sum(dim=(2, 3))  # a row that sees nothing adds 0
            if seen is not None:
                seen = seen + vis.sum(dim=2, dtype=torch.float32)
        slots["acc"] = acc
        if seen is not None:
            slots["seen"] = seen

    def score(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] float32 accumulated attention (zeros before any `observe`)."""
        slots = view.state.get("slots", {})
        acc = _extended(slots, "acc", view.positions)
        if not self.normalize:
            return acc
        return acc / _extended(slots, "seen", view.positions).clamp(min=1.0)

    def forced(self, view: LayerView) -> torch.Tensor:
        return recent_slots(view.positions, self.recent_count(view.budget, view.window))
