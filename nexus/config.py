"""`EvictionConfig`: which method, when it runs, and how much it keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nexus.policies import METHODS, Policy, make_policy

SCOPES = ("prefill_only", "prefill_decode")


@dataclass(frozen=True, init=False)
class EvictionConfig:
    """Validated eviction settings. Defaults are the paper's (density 20%, b=32, W=16, seed 0).

    method:        a name from `nexus.policies.METHODS`.
    scope:         "prefill_only" (evict once at the end of each prefill) or "prefill_decode" (also while
                   decoding, whenever a layer reaches budget + slack).
    density:       kept fraction of the logical length at the end of each prefill, in (0, 1].
    budget_tokens: an absolute per-head budget instead of `density` (takes precedence when set).
    block_size:    b, key-block granularity (Nexus scoring; the decode slack is counted in blocks).
    window:        W, the observation window of recent queries, and the recency window kept by most methods.
    slack_blocks:  under prefill_decode a layer may grow to budget + slack_blocks * block_size before it is
                   evicted back down to the budget; this amortises the per-event cost.
    seed:          seeds every random choice (Nexus reservoir) together with the layer and event number.
    method_params: the method's own hyperparameters (e.g. `walk_steps=3` for nexus), validated by it.
    """

    method: str
    scope: str
    density: float
    budget_tokens: int | None
    block_size: int
    window: int
    slack_blocks: int
    seed: int
    method_params: dict[str, Any] = field(default_factory=dict)
    policy: Policy = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __init__(
        self,
        method: str = "nexus",
        scope: str = "prefill_decode",
        density: float = 0.2,
        budget_tokens: int | None = None,
        block_size: int = 32,
        window: int = 16,
        seed: int = 0,
        slack_blocks: int = 1,
        **method_params: Any,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown eviction method {method!r}; known: {', '.join(METHODS)}")
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        if isinstance(density, bool) or not isinstance(density, int | float) or not math.isfinite(density):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        if not 0.0 < float(density) <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")
        for name, value, lo in (
            ("block_size", block_size, 1),
            ("window", window, 1),
            ("slack_blocks", slack_blocks, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
        if budget_tokens is not None and (
            isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1
        ):
            raise ValueError(f"budget_tokens must be a positive integer or None, got {budget_tokens!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        policy = make_policy(method, **method_params)
        floor = policy.min_budget(window, block_size)
        if budget_tokens is not None and policy.evicts and budget_tokens < floor:
            raise ValueError(
                f"budget_tokens={budget_tokens} is below what {method} must keep (sink/recency: {floor}); "
                f"raise it or lower window/block_size"
            )
        for k, v in dict(
            method=method,
            scope=scope,
            density=float(density),
            budget_tokens=budget_tokens,
            block_size=block_size,
            window=window,
            slack_blocks=slack_blocks,
            seed=seed,
            method_params=dict(method_params),
            policy=policy,
        ).items():
            object.__setattr__(self, k, v)

    @property
    def slack(self) -> int:
        """Tokens a layer may grow past its budget while decoding before the next event."""
        return self.slack_blocks * self.block_size

    @property
    def evicts(self) -> bool:
        return self.policy.evicts

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form; `EvictionConfig(**cfg.to_dict())` rebuilds it."""
        d = {
            k: getattr(self, k)
            for k in ("method", "scope", "density", "budget_tokens", "block_size", "window", "seed", "slack_blocks")
        }
        d.update(self.method_params)
        return d

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self.to_dict().items())))
