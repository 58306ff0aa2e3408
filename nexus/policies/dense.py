"""Dense: full attention, nothing is ever evicted (the reference every method is compared against)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nexus.methods import register
from nexus.policies.base import LayerView, Policy


@register("dense", order=0)
@dataclass(frozen=True)
class Dense(Policy):
    """Keeps every token. The cache skips eviction entirely (`evicts = False`)."""

    name: ClassVar[str] = "dense"
    needs_queries: ClassVar[bool] = False
    evicts: ClassVar[bool] = False

    def min_budget(self, window: int, block_size: int) -> int:
        return 1

    def select(self, view: LayerView):
        raise RuntimeError("dense never evicts")
