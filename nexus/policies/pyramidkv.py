"""PyramidKV: SnapKV's score with a per-layer budget that shrinks with depth (Cai et al., "PyramidKV:
Dynamic KV Cache Compression based on Pyramidal Information Funneling").

Scoring and selection are exactly `SnapKV`'s (window attention, mean over window rows and the G heads of
a KV group, pooling, the last W tokens forced inside the layer's budget). Only `layer_budget` differs.

Per-layer schedule (KVCache-Factory `PyramidKVCluster`), for base budget C, window W, L layers, this
layer's physical length T, `beta`:
    c    = C - W                      selected (non-window) tokens per head on average
    min  = c // beta
    max  = 2c - min
    if max >= T - W:  max = T - W;  min = 2c - max       (only when `cap_to_length`)
    step = (max - min) // (L - 1)
    layer l keeps  max - l * step + W
An arithmetic sequence from max + W (layer 0) down to about min + W (layer L-1) whose mean is about C,
so the total matches SnapKV's uniform budget: the mean is C + ((max - min) mod (L - 1)) / 2, i.e. above C
by less than (L - 1) / 2 tokens because the step is floored.

Degenerate cases fall back to the uniform budget C: a single layer (L == 1), no selected part (c <= 0),
a negative minimum (min < 0), or max < min (only when T < C, where nothing needs evicting anyway).

Deliberate differences and choices:
- The window is counted inside each layer's result (max - l*step + W is the whole layer budget); the
  original selects max - l*step tokens and adds the W window on top, which is the same total. kvpress's
  `PyramidKVPress` instead folds the window into max - l*step (a smaller total by W); we follow the
  original's totals.
- The original has a third branch, "T < 2c: uniform c + W"; we use the schedule (capped) there as well,
  so the pyramid's mean stays C for short prompts. It only matters at densities near 0.5 or above.
- `T` is this layer's physical length at the event, the only length the cache passes. In a single-shot
  prefill every layer has the same T, as in the original. When layers hold different lengths (a decode
  event under prefill_decode, a later turn under true eviction) the cap makes each layer's schedule use
  its own T, which flattens the pyramid towards the uniform budget for layers whose T is small. Set
  `cap_to_length=False` to make the schedule depend only on (C, W, beta, L), stable across events.
- The top layer may keep only the window (min = 0 when c < beta), as in the original.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nexus.methods import register
from nexus.policies.base import check_bool, check_int
from nexus.policies.snapkv import SnapKV


def pyramid_budget(
    budget: int, layer_idx: int, num_layers: int, length: int, window: int, beta: int, cap_to_length: bool
) -> int:
    """Slots layer `layer_idx` keeps per KV head under the PyramidKV schedule (see the module docstring)."""
    c = budget - window
    if num_layers <= 1 or c <= 0:
        return budget
    lo = c // beta
    hi = 2 * c - lo
    if cap_to_length and hi >= length - window:
        hi = length - window
        lo = 2 * c - hi
    if lo < 0 or hi < lo:
        return budget
    step = (hi - lo) // (num_layers - 1)
    return hi - layer_idx * step + window


@register("pyramidkv", order=2)
@dataclass(frozen=True)
class PyramidKV(SnapKV):
    """SnapKV with PyramidKV's per-layer budgets.

    beta:          ratio between the average and the top layer's selected count (default 20, the reference's).
    cap_to_length: apply the reference's cap of the bottom layer at T - W (see the module docstring).
    Plus SnapKV's kernel_size / pooling / pool_per_query_head.
    """

    name: ClassVar[str] = "pyramidkv"

    beta: int = 20
    cap_to_length: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.name, "beta", self.beta, 1)
        check_bool(self.name, "cap_to_length", self.cap_to_length)

    def layer_budget(self, budget: int, layer_idx: int, num_layers: int, length: int, window: int) -> int:
        return pyramid_budget(budget, layer_idx, num_layers, length, window, self.beta, self.cap_to_length)
