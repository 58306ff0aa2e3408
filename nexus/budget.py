"""The budget rule, in one place.

At the end of every prefill (a forward that feeds more than one token) the per-head budget becomes
`ceil(density * logical_length)` (or `budget_tokens`), never below what the method must force-keep.
It then stays fixed while that turn decodes, so under `prefill_decode` the cache is pinned at that size
(the paper's Table 5); a multi-turn stream's budget grows only at each new prefill. Under the
full-context protocol every turn is a fresh prefill of the whole history, so the budget is density x
the whole history each turn.

Under `prefill_decode` a layer is evicted while decoding when it holds budget + slack slots, back down
to its budget; `slack` is a whole number of blocks, so events are amortised over `slack` decode steps.
"""

from __future__ import annotations

import math

from nexus.config import EvictionConfig


def prefill_budget(config: EvictionConfig, logical_length: int) -> int:
    """Per-KV-head budget (tokens) set at the end of a prefill whose stream is `logical_length` long."""
    base = config.budget_tokens if config.budget_tokens is not None else math.ceil(config.density * logical_length)
    return max(base, config.policy.min_budget(config.window, config.block_size))


def should_evict(config: EvictionConfig, *, phase: str, occupancy: float, budget: int) -> bool:
    """Whether a layer holding `occupancy` tokens per head (mean over heads) must be evicted now."""
    if not config.evicts:
        return False
    if phase == "prefill":
        return occupancy > budget
    return config.scope == "prefill_decode" and occupancy >= budget + config.slack


def appends_before_decode_event(*, budget: int, slack: int, occupancy: float) -> int:
    """Tokens a layer holding `occupancy` per head can append before its next decode-time event, which fires
    after the append that reaches `budget + slack` (the `should_evict` rule): at least the one that fires it."""
    return max(math.ceil(budget + slack - occupancy), 1)
