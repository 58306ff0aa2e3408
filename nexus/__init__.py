"""nexus: a persistent, evictable KV cache for transformers, with Nexus Sampling and the baselines.

import nexus
nexus.prepare(model)                                   # once: installs the capture attention
cache = nexus.EvictableCache(model.config, nexus.EvictionConfig(method="nexus", density=0.2))
model.generate(ids, cache=cache, max_new_tokens=64)    # eviction happens inside the forward
cache.logical_length, cache.physical_length(0), cache.retained_positions(0), cache.nbytes(), cache.events
"""

from nexus.attention import cache_kwarg, prepare
from nexus.budget import prefill_budget, should_evict
from nexus.cache import EvictableCache, EvictionEvent
from nexus.config import SCOPES, EvictionConfig
from nexus.policies import METHODS, make_policy

__all__ = [
    "METHODS",
    "SCOPES",
    "EvictableCache",
    "EvictionConfig",
    "EvictionEvent",
    "cache_kwarg",
    "make_policy",
    "prefill_budget",
    "prepare",
    "should_evict",
]
