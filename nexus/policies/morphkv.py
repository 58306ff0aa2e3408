"""MorphKV: correlation-aware selection by what the recent window attends to (Ghadia et al., "Dialogue
Without Limits: Constant-Sized KV Caches for Extended Responses in LLMs", ICML'25).

Score, per KV head (B batch, Hkv KV heads, G = Hq // Hkv, w <= W window rows, P slots):
1. "Old" slots: every valid slot except the most recent W + 1 tokens by logical position (the window
   plus one, which are forced).
2. Logits q k^T * scaling of the w stored window queries (post-RoPE) against every slot, fp32,
   [B, Hkv, G, w, P], SUMMED over the G query heads of the group before the softmax (as the reference's
   KV mask does) -> [B, Hkv, w, P].
3. Softmax per row over the old slots only (renormalised: the window's own keys are not in the
   denominator, unlike SnapKV), causal by logical position.
4. Fuse the rows: `fusion="max"` (the reference scripts' `max_fused`) or "sum" (`sum_fused`).
Selection: the last W + 1 tokens forced, then the top (budget - (W + 1)) old slots by the fused score.

Deliberate differences and choices:
- When it evicts: the reference evicts at every decode step, before that step's attention, with a
  rolling buffer of cached logits. We evict after a forward's attention when a layer reaches
  budget + slack (amortised), recomputing the logits from the stored window queries. That is the same
  quantity: cached keys are already rotated, so q k^T from stored post-RoPE queries equals the cached
  logits. Under prefill_only it runs once at the end of each prefill with this score (the reference does
  no prefill compression).
- The rows: after the forward of token t our window is tokens t-W+1..t (it includes the newest token) and
  tokens t-W..t are forced; the reference, scoring before token t+1 attends, uses rows t-W+1..t and forces
  t-W+1..t+1. Our kept set has the same size as the reference's after t+1 is appended (budget + 1 there).
- W is `EvictionConfig.window` (16 under the `paper` preset, shared by every method) rather than the
  reference's per-benchmark values (3 in its scripts, 32 / 30 / 200 in its README); fusion defaults to the
  scripts' "max". The `reference` preset sets W = 3 and `slack_blocks=0`, which evicts at every decode step
  as the reference does (with our after-attention timing described above).
- Selection per KV head; the reference's logit cache is per query head, but its mask is per KV head too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from nexus.methods import register
from nexus.policies.base import (
    NEG_INF,
    LayerView,
    ScorePolicy,
    check_choice,
    group_queries,
    recent_slots,
    visibility,
)

FUSIONS = ("max", "sum")


@register("morphkv", order=6)
@dataclass(frozen=True)
class MorphKV(ScorePolicy):
    """Recent-window attention over the old tokens, fused over rows; the last W + 1 tokens forced.

    fusion: "max" or "sum" over the window rows of the per-row renormalised attention.
    """

    name: ClassVar[str] = "morphkv"

    fusion: str = "max"

    def __post_init__(self) -> None:
        check_choice(self.name, "fusion", self.fusion, FUSIONS)

    def min_budget(self, window: int, block_size: int) -> int:
        return window + 2

    def forced(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] bool: the last W + 1 valid tokens (capped at the budget)."""
        return recent_slots(view.positions, min(view.window + 1, view.budget))

    def score(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] float32 fused attention on old slots; 0 on forced and empty slots."""
        old = view.valid & ~self.forced(view)
        q = group_queries(view.queries, view.num_kv_heads).float()  # [B, Hkv, G, w, D]
        logits = torch.einsum("bhgwd,bhpd->bhwp", q, view.keys.float()) * view.scaling  # summed over G
        seen = visibility(view.query_positions, view.positions) & old.unsqueeze(2)  # [B, Hkv, w, P]
        probs = torch.softmax(logits.masked_fill(~seen, NEG_INF), dim=-1).nan_to_num(0.0)
        return probs.amax(dim=2) if self.fusion == "max" else probs.sum(dim=2)
