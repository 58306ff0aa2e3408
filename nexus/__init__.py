"""nexus: a persistent, evictable KV cache for transformers, with Nexus Sampling and the baselines.

    import nexus
    nexus.prepare(model)                                   # once: installs the capture attention
    cache = nexus.EvictableCache(model.config, nexus.EvictionConfig(method="nexus", density=0.2))
    model.generate(ids, cache=cache, max_new_tokens=64)    # eviction happens inside the forward
    cache.logical_length, cache.physical_length(0), cache.retained_positions(0), cache.events
    cache.memory()                                         # KVMemory: bytes held, allocated, and their peaks
    nexus.retention_runs(cache)                            # per layer: how many KV heads hold each position

``import nexus`` needs no torch: the vocabulary (``METHODS``, ``SCOPES``), ``EvictionConfig`` and ``KVMemory`` are
plain Python, and the tensor parts below are imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nexus.config import EvictionConfig
from nexus.lazy import lazy_attribute
from nexus.memory import KVMemory
from nexus.methods import METHODS, SCOPES

if TYPE_CHECKING:
    from nexus.attention import cache_kwarg, prepare
    from nexus.batch import CacheStack
    from nexus.budget import prefill_budget, should_evict
    from nexus.cache import EvictableCache, EvictionEvent
    from nexus.policies import make_policy
    from nexus.retention import retention_runs

#: name -> the module that defines it (imported when the name is first used)
_LAZY = {
    "CacheStack": "nexus.batch",
    "EvictableCache": "nexus.cache",
    "EvictionEvent": "nexus.cache",
    "cache_kwarg": "nexus.attention",
    "prepare": "nexus.attention",
    "prefill_budget": "nexus.budget",
    "should_evict": "nexus.budget",
    "make_policy": "nexus.policies",
    "retention_runs": "nexus.retention",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name, globals())


__all__ = [
    "METHODS",
    "SCOPES",
    "CacheStack",
    "EvictableCache",
    "EvictionConfig",
    "EvictionEvent",
    "KVMemory",
    "cache_kwarg",
    "make_policy",
    "prefill_budget",
    "prepare",
    "retention_runs",
    "should_evict",
]
