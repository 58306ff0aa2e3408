"""Ada-KV: head-adaptive per-layer budgets on top of any `ScorePolicy` (ada_snapkv, ada_pyramidkv, ada_nexus).

Allocation (Feng et al., "Ada-KV"; the reference code is FFY0/AdaKV's `AdaptiveSnapKVCluster`), per layer
and batch row, with H = Hkv KV heads and a per-head budget `view.budget`:

1. scores [B, H, P] = inner.score(view); forced [B, H, P] = inner.forced(view) (e.g. the recency window).
2. B' = floor((H * budget - total forced slots) / H): the selectable slots a head has on average.
   With `normalize` each head's scores are first multiplied by (mass of its top B' non-forced scores) /
   (mass of all its non-forced scores), as AdaKV's `normalize` option does.
3. Take the global top H * B' of the non-forced valid scores across all heads of the row;
   n_h = how many of them belong to head h.
4. cap_h = round(n_h * (1 - alpha) + floor(B' * alpha)), alpha = `floor_alpha` (the safeguard floor:
   every head gets at least floor(B' * alpha) of its own best slots). Sum over heads ~= H * B'.
5. counts_h = cap_h + forced_h, clamped to the head's valid slots; return inner.select_counts(view, counts),
   i.e. [B, H, max count] ascending slot indices, -1 padded where a head keeps fewer.

What matches the reference (FFY0/AdaKV `AdaptiveSnapKVCluster`, read at efe4e2e): the window is inside
the budget there too (its base capacity is the budget minus W), the floor is int(B' * alpha), the rounding
is torch.round (half to even), and scores are not renormalised unless `normalize` is set (its
`config_compress` leaves it off; KVCache-Factory's `init_adakv` turns it on: the `kvcache_factory` preset).
floor_alpha defaults to 0.2, the value AdaKV's LongBench script passes ("we suggest 0.2 while using gqa",
`experiments/LongBench/pred.py`); `config_compress`'s own default is 0.5.

Deliberate differences: the forced set is whatever the inner policy forces (W tokens for SnapKV and
PyramidKV, whole sink/recency blocks for Nexus), counted per head, where the reference always adds the
last W tokens; the allocation runs per batch row where the reference asserts batch size 1; and every
eviction event (each prefill, and each decode event under prefill_decode) reallocates, where the reference
compresses once after the prompt.
The number of slots a head keeps is decided by this allocation; which slots is the inner policy's
`select_counts` (SnapKV/PyramidKV: per-head top-count; Nexus: per-head block reservoir, see nexus.py).
min_budget, layer_budget (so Ada-PyramidKV gets the pyramid schedule), needs_queries, observes, observe_additive
and observe are the inner policy's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from nexus.methods import register
from nexus.policies.base import NEG_INF, LayerView, Policy, ScorePolicy, check_bool, check_number
from nexus.policies.reservoir import descending_ranks


def normalized_scores(scores: torch.Tensor, candidates: torch.Tensor, per_head: torch.Tensor) -> torch.Tensor:
    """scores [B, H, P] times each head's share of its own mass in its top `per_head` [B] candidates."""
    s = scores.float().masked_fill(~candidates, 0.0)
    ranked = s.sort(dim=-1, descending=True).values
    top = (torch.arange(s.shape[-1], device=s.device) < per_head.view(-1, 1, 1)).float()
    ratio = (ranked * top).sum(-1, keepdim=True) / ranked.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    return scores.float() * ratio


def head_counts(
    scores: torch.Tensor,
    forced: torch.Tensor,
    valid: torch.Tensor,
    budget: int,
    floor_alpha: float,
    normalize: bool = False,
) -> torch.Tensor:
    """[B, H] long slots each KV head keeps (forced included), from scores/forced/valid [B, H, P]."""
    b, h, p = scores.shape
    forced = forced & valid
    forced_h = forced.sum(-1)  # [B, H]
    selectable = (h * budget - forced_h.sum(-1)).clamp_min(0)  # [B]
    per_head = selectable // h  # B'
    if normalize:
        scores = normalized_scores(scores, valid & ~forced, per_head)
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
    normalize: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.inner, ScorePolicy):
            raise ValueError(
                f"ada: inner must be a ScorePolicy (a score fed to top-K), got {type(self.inner).__name__}"
            )
        check_number(self.name, "floor_alpha", self.floor_alpha, 0.0, 1.0)
        check_bool(self.name, "normalize", self.normalize)

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"ada_{self.inner.name}"

    @property
    def needs_queries(self) -> bool:  # type: ignore[override]
        return self.inner.needs_queries

    @property
    def observes(self) -> bool:  # type: ignore[override]
        return self.inner.observes

    @property
    def observe_additive(self) -> bool:  # type: ignore[override]
        return self.inner.observe_additive

    def min_budget(self, window: int, block_size: int) -> int:
        return self.inner.min_budget(window, block_size)

    def layer_budget(self, budget: int, layer_idx: int, num_layers: int, length: int, window: int) -> int:
        return self.inner.layer_budget(budget, layer_idx, num_layers, length, window)

    def observe(self, view: LayerView, new_queries: torch.Tensor, new_positions: torch.Tensor) -> None:
        self.inner.observe(view, new_queries, new_positions)

    def counts(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv] long: the per-head slot counts this layer keeps at this event."""
        scores, forced = self.inner.score(view), self.inner.forced(view)
        return head_counts(scores, forced, view.valid, view.budget, self.floor_alpha, self.normalize)

    def select(self, view: LayerView) -> torch.Tensor:
        return self.inner.select_counts(view, self.counts(view))

    @classmethod
    def around(cls, inner: Callable[..., ScorePolicy], params: dict[str, Any]) -> AdaKV:
        """Ada-KV around ``inner(**its settings)``: ``params`` holds this class's own settings (``floor_alpha``,
        ``normalize``; their defaults are the fields above, the one place they are written) and the inner
        policy's, which go to ``inner``."""
        own = {f.name for f in fields(cls) if f.name != "inner"}
        inner_params = {k: v for k, v in params.items() if k not in own}
        return cls(inner(**inner_params), **{k: v for k, v in params.items() if k in own})


# Each factory's settings are read from its signature (``nexus.presets``, without importing torch): the fields with
# a default of the class it returns (``-> AdaKV``), then those of the method its ``**<method>_params`` names.


@register("ada_snapkv", order=3)
def ada_snapkv(**snapkv_params: Any) -> AdaKV:
    """Ada-SnapKV: SnapKV's score with Ada-KV allocation; keywords: AdaKV's settings and SnapKV's."""
    from nexus.policies.snapkv import SnapKV

    return AdaKV.around(SnapKV, snapkv_params)


@register("ada_pyramidkv", order=4)
def ada_pyramidkv(**pyramidkv_params: Any) -> AdaKV:
    """Ada-PyramidKV: PyramidKV's per-layer schedule and score, Ada-KV allocation inside each layer; keywords:
    AdaKV's settings and PyramidKV's."""
    from nexus.policies.pyramidkv import PyramidKV

    return AdaKV.around(PyramidKV, pyramidkv_params)


@register("ada_nexus", order=9)
def ada_nexus(**nexus_params: Any) -> AdaKV:
    """Ada-Nexus: per-head Nexus scores and block reservoir (nexus.py) with Ada-KV allocation; keywords: AdaKV's
    settings and Nexus's."""
    from nexus.policies.nexus import Nexus

    return AdaKV.around(Nexus, nexus_params)
