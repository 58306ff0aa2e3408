"""Ada-KV: head-adaptive per-layer budgets on top of any `ScorePolicy` (ada_snapkv, ada_pyramidkv, ada_nexus).

Allocation (Feng et al., "Ada-KV"; the reference code is FFY0/AdaKV's `AdaptiveSnapKVCluster`), per layer
and batch row, with H = Hkv KV heads and a per-head budget `view.budget`:

1. scores [B, H, P] = inner.score(view); forced [B, H, P] = inner.forced(view) (e.g. the recency window).
2. B' = floor((H * budget - total forced slots) / H): the selectable slots a head has on average.
3. Take the global top H * B' of the non-forced valid scores across all heads of the row;
   n_h = how many of them belong to head h.
4. cap_h = round(n_h * (1 - alpha) + floor(B' * alpha)), alpha = `floor_alpha` (the safeguard floor:
   every head gets at least floor(B' * alpha) of its own best slots). Sum over heads ~= H * B'.
5. counts_h = cap_h + forced_h, clamped to the head's valid slots; return inner.select_counts(view, counts),
   i.e. [B, H, max count] ascending slot indices, -1 padded where a head keeps fewer.

Deliberate differences from the reference code: the forced set counts inside the budget (the reference
adds the window on top), so the layer holds ~H * budget slots in total; the scores are not renormalised
per head (AdaKV's `normalize`, off in its `config_compress`); round() is round-half-to-even (torch.round).
floor_alpha defaults to 0.2, AdaKV's suggestion for GQA models (`experiments/LongBench/pred.py`).
The number of slots a head keeps is decided by this allocation; which slots is the inner policy's
`select_counts` (SnapKV/PyramidKV: per-head top-count; Nexus: per-head block reservoir, see nexus.py).
min_budget, layer_budget (so Ada-PyramidKV gets the pyramid schedule), needs_queries, observes and
observe are the inner policy's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from nexus.methods import register
from nexus.policies.base import NEG_INF, LayerView, Policy, ScorePolicy
from nexus.policies.reservoir import descending_ranks


def head_counts(
    scores: torch.Tensor, forced: torch.Tensor, valid: torch.Tensor, budget: int, floor_alpha: float
) -> torch.Tensor:
    """[B, H] long slots each KV head keeps (forced included), from scores/forced/valid [B, H, P]."""
    b, h, p = scores.shape
    forced = forced & valid
    forced_h = forced.sum(-1)  # [B, H]
    selectable = (h * budget - forced_h.sum(-1)).clamp_min(0)  # [B]
    per_head = selectable // h  # B'
    candidates = (valid & ~forced).flatten(1)  # [B, H*P]
    flat = scores.float().flatten(1).masked_fill(~candidates, NEG_INF)
    winners = candidates & (descending_ranks(flat) < (h * per_head).unsqueeze(-1))
    n_h = winners.view(b, h, p).sum(-1).double()
    floor = torch.floor(per_head.double() * floor_alpha).unsqueeze(-1)
    cap = torch.round(n_h * (1.0 - floor_alpha) + floor).long()
    return (cap + forced_h).minimum(valid.sum(-1))


@dataclass(frozen=True)
class AdaKV(Policy):
    """Ada-KV head-adaptive allocation around `inner` (a ScorePolicy); see the module docstring."""

    inner: ScorePolicy
    floor_alpha: float = 0.2

    def __post_init__(self) -> None:
        if not isinstance(self.inner, ScorePolicy):
            raise ValueError(
                f"ada: inner must be a ScorePolicy (a score fed to top-K), got {type(self.inner).__name__}"
            )
        a = self.floor_alpha
        ok = not isinstance(a, bool) and isinstance(a, int | float) and math.isfinite(a)
        if not ok or not 0.0 <= a <= 1.0:
            raise ValueError(f"ada: floor_alpha must be a number in [0, 1], got {a!r}")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"ada_{self.inner.name}"

    @property
    def needs_queries(self) -> bool:  # type: ignore[override]
        return self.inner.needs_queries

    @property
    def observes(self) -> bool:  # type: ignore[override]
        return self.inner.observes

    def min_budget(self, window: int, block_size: int) -> int:
        return self.inner.min_budget(window, block_size)

    def layer_budget(self, budget: int, layer_idx: int, num_layers: int, length: int, window: int) -> int:
        return self.inner.layer_budget(budget, layer_idx, num_layers, length, window)

    def observe(self, view: LayerView, new_queries: torch.Tensor, new_positions: torch.Tensor) -> None:
        self.inner.observe(view, new_queries, new_positions)

    def counts(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv] long: the per-head slot counts this layer keeps at this event."""
        return head_counts(self.inner.score(view), self.inner.forced(view), view.valid, view.budget, self.floor_alpha)

    def select(self, view: LayerView) -> torch.Tensor:
        return self.inner.select_counts(view, self.counts(view))


@register("ada_snapkv", order=3)
def ada_snapkv(floor_alpha: float = 0.2, **snapkv_params: Any) -> AdaKV:
    """Ada-SnapKV: SnapKV's score (its own hyperparameters as keywords) with Ada-KV allocation."""
    from nexus.policies.snapkv import SnapKV

    return AdaKV(SnapKV(**snapkv_params), floor_alpha)


@register("ada_pyramidkv", order=4)
def ada_pyramidkv(floor_alpha: float = 0.2, **pyramidkv_params: Any) -> AdaKV:
    """Ada-PyramidKV: PyramidKV's per-layer schedule and score, Ada-KV allocation inside each layer."""
    from nexus.policies.pyramidkv import PyramidKV

    return AdaKV(PyramidKV(**pyramidkv_params), floor_alpha)


@register("ada_nexus", order=9)
def ada_nexus(floor_alpha: float = 0.2, **nexus_params: Any) -> AdaKV:
    """Ada-Nexus: per-head Nexus scores and block reservoir (nexus.py) with Ada-KV allocation."""
    from nexus.policies.nexus import Nexus

    return AdaKV(Nexus(**nexus_params), floor_alpha)
