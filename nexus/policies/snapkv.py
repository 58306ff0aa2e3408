"""SnapKV: keep what the observation window attends to (Li et al., "SnapKV: LLM Knows What You are Looking
for Before Generation").

Score, per KV head (shapes: B batch, Hkv KV heads, G = Hq // Hkv, w <= W window rows, P slots):
1. `window_attention`: the last w post-RoPE queries against every physical key, scaled, causal by logical
   position, softmax over everything visible in fp32 -> [B, Hkv, G, w, P]. The window's own keys stay in
   the softmax denominator, as in the original.
2. Mean over the w window rows and over the G query heads of the group -> [B, Hkv, P].
3. The forced slots (the last W tokens) and empty slots are zeroed, as the original drops the window
   columns before pooling (so pooling never spreads window mass onto its neighbours).
4. 1-D pooling along the slot axis: kernel `kernel_size`, stride 1, padding kernel_size // 2, so the
   length is preserved. "max" pads with -inf (scores are >= 0, so zero-padding is equivalent) and "avg"
   divides by the full kernel (PyTorch's `count_include_pad=True`, as the original's `avg_pool1d`).
Selection: the last W tokens are forced, then the top (budget - W) remaining slots by the pooled score.

Deliberate differences from the reference code (all documented choices):
- Mean over window rows and group heads (kvpress / AdaKV / KVCache-Factory kv_head); the original sums over
  rows. The ranking within a head is the same; only the scale across heads differs (matters for Ada).
- KV-head granularity: the original `repeat_kv`s before compressing and selects per query head. We select
  per KV head; `pool_per_query_head` chooses whether the G heads are averaged before pooling (default,
  KVCache-Factory kv_head mode) or each query head is pooled and the pooled scores averaged (kvpress order).
  With "avg" pooling both are identical; with "max" they differ.
- The window is counted INSIDE the budget (kvpress convention): a head keeps exactly `budget` slots, of
  which W are the window. SnapKV's own `max_capacity_prompt` also includes the window (it selects
  capacity - W by score and appends the W window); what adds W on top of its selected count is
  PyramidKV's per-layer schedule (see `pyramidkv.py`).
- Pooling runs along slot order, which is time order of the retained tokens; after an earlier eviction
  the neighbours of a slot need not be logically adjacent (no reference compresses twice).
- Defaults: kernel 7 with max pooling, the paper's LongBench configs (`*_w32_k7_maxpool.json`); the class
  defaults there are 5 / avg. W comes from `EvictionConfig.window` (16, the shared window, under the
  `paper` preset; 32 under `reference`, 8 under `kvcache_factory`).
- Score precision: the score stays fp32 from the softmax through pooling and top-K. The original computes
  the softmax in fp32 but casts the probabilities back to the model dtype (bf16 for these models) before
  summing, pooling and top-K, so near-equal scores tie more often there and break by index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from nexus.methods import register
from nexus.policies.base import LayerView, ParamError, ScorePolicy, check_bool, check_choice, window_attention

POOLINGS = ("max", "avg")


def pool_slots(scores: torch.Tensor, kernel_size: int, pooling: str) -> torch.Tensor:
    """1-D pooling along the last axis, stride 1, length preserved. scores: [..., P] float32 >= 0."""
    if kernel_size == 1:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    pad = kernel_size // 2
    if pooling == "max":
        pooled = F.max_pool1d(flat, kernel_size, stride=1, padding=pad)
    else:
        pooled = F.avg_pool1d(flat, kernel_size, stride=1, padding=pad, count_include_pad=True)
    return pooled.reshape(shape)


def validate_pooling(method: str, kernel_size: int, pooling: str) -> None:
    """Raise ParamError naming the bad pooling hyperparameter of `method`."""
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ParamError(method, "kernel_size", "an odd integer >= 1 (length-preserving)", kernel_size)
    check_choice(method, "pooling", pooling, POOLINGS)


@register("snapkv", order=1)
@dataclass(frozen=True)
class SnapKV(ScorePolicy):
    """Window-attention score, pooled; the last W tokens forced inside the budget.

    kernel_size:         pooling kernel along the slot axis (odd; 1 disables pooling).
    pooling:             "max" (paper's LongBench configs) or "avg" (reference class default).
    pool_per_query_head: False = average the G group heads, then pool (kv_head mode); True = pool each
                         query head, then average (kvpress's order).
    """

    name: ClassVar[str] = "snapkv"

    kernel_size: int = 7
    pooling: str = "max"
    pool_per_query_head: bool = False

    def __post_init__(self) -> None:
        validate_pooling(self.name, self.kernel_size, self.pooling)
        check_bool(self.name, "pool_per_query_head", self.pool_per_query_head)

    def score(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] float32 pooled window attention; 0 on forced and empty slots before pooling."""
        probs = window_attention(view).mean(dim=3)  # [B, Hkv, G, P]: mean over window rows
        drop = (self.forced(view) | ~view.valid).unsqueeze(2)
        probs = probs.masked_fill(drop, 0.0)
        if self.pool_per_query_head:
            return pool_slots(probs, self.kernel_size, self.pooling).mean(dim=2)
        return pool_slots(probs.mean(dim=2), self.kernel_size, self.pooling)
