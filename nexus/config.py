"""`EvictionConfig`: which method, when it runs, and how much it keeps.

Importing this module (and building a config from stored JSON) needs no torch: the settings are checked
against the vocabulary of ``nexus.methods``; the policy itself, with its own hyperparameters, is built on
first use of ``config.policy``.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from nexus.methods import SCOPES, check_method, check_scope
from nexus.presets import DEFAULT_PRESET

#: what an eviction event may choose among (``EvictionConfig.candidates``), the published behaviour first
CANDIDATES: tuple[str, ...] = ("all", "newest_turn")

if TYPE_CHECKING:
    from nexus.policies.base import Policy


@dataclass(frozen=True, init=False)
class EvictionConfig:
    """Validated eviction settings. The field defaults below are the paper's, written here once: the job spec
    (``jobs.spec.JobSpec``) and the runner read them (:data:`EVICTION_DEFAULTS`), and
    tests/nexus/test_presets.py holds them against the paper's published values.

    method:        a name from `nexus.methods.METHODS`.
    scope:         "prefill_only" (evict once at the end of each prefill) or "prefill_decode" (also while
                   decoding, whenever a layer reaches budget + slack).
    density:       kept fraction of the logical length at the end of each prefill, in (0, 1].
    budget_tokens: an absolute per-head budget instead of `density` (takes precedence when set).
    block_size:    b, key-block granularity (Nexus scoring; the decode slack is counted in blocks).
    window:        W, the observation window of recent queries, and the recency window kept by most methods.
    slack_blocks:  under prefill_decode a layer may grow to budget + slack_blocks * block_size before it is
                   evicted back down to the budget; this amortises the per-event cost.
    seed:          seeds every random choice (Nexus reservoir) together with the layer and event number.
    candidates:    which held entries an event may evict: "all" (every method's published behaviour) or
                   "newest_turn" (only what arrived since the cache's previous compression; earlier turns' kept
                   entries stay as they are, FlowKV's isolated per-turn compression; see `nexus.candidates`).
    method_params: the method's own hyperparameters (e.g. `walk_steps=3` for nexus), validated by it.

    ``EvictionConfig(method="nexus", walk_steps=3)``: keywords that are not fields go to ``method_params``.
    Built this way the policy is built at once, so a bad hyperparameter fails here. A pydantic model that
    holds an ``EvictionConfig`` (the service's episode spec) validates the fields without torch and leaves the
    method's own parameters to the first use of ``policy``.
    """

    method: str = "nexus"
    scope: str = "prefill_decode"
    density: float = 0.2
    budget_tokens: int | None = None
    block_size: int = 32
    window: int = 16
    slack_blocks: int = 1
    seed: int = 0
    candidates: str = "all"
    method_params: dict[str, Any] = field(default_factory=dict)

    # for pydantic models that hold one: a key that is not a field is an error, not silently dropped
    __pydantic_config__ = {"extra": "forbid"}

    def __init__(self, **values: Any) -> None:
        names = {f.name for f in fields(self)}
        params = {**(values.pop("method_params", None) or {})}
        params.update({key: values.pop(key) for key in list(values) if key not in names})
        for f in fields(self):
            default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
            object.__setattr__(self, f.name, values.get(f.name, default))
        object.__setattr__(self, "method_params", params)
        self.__post_init__()
        _ = self.policy  # a bad method parameter fails now, not at the first eviction

    def __post_init__(self) -> None:
        """The checks that need no torch (pydantic calls only this one)."""
        check_method(self.method)
        check_scope(self.scope)
        density = self.density
        if isinstance(density, bool) or not isinstance(density, int | float) or not math.isfinite(density):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        if not 0.0 < float(density) <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")
        object.__setattr__(self, "density", float(density))
        for name, lo in (("block_size", 1), ("window", 1), ("slack_blocks", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
        budget = self.budget_tokens
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"budget_tokens must be a positive integer or None, got {budget!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.candidates not in CANDIDATES:
            raise ValueError(f"candidates must be one of {', '.join(CANDIDATES)}, got {self.candidates!r}")
        if not isinstance(self.method_params, dict):
            raise ValueError(f"method_params must be a mapping, got {self.method_params!r}")

    @classmethod
    def from_preset(cls, method: str, preset: str = DEFAULT_PRESET, **values: Any) -> EvictionConfig:
        """``method`` under a named preset (``nexus.presets``: paper, reference, kvcache_factory); ``values``
        (shared fields, scope/density/seed, or the method's own hyperparameters) override the preset's."""
        from nexus.presets import preset_settings

        return cls(method=method, **{**preset_settings(method, preset), **values})

    @cached_property
    def policy(self) -> Policy:
        """The method's policy object (imports torch); ValueError for a bad hyperparameter or budget."""
        from nexus.policies import make_policy

        policy = make_policy(self.method, **self.method_params)
        floor = policy.min_budget(self.window, self.block_size)
        if self.budget_tokens is not None and policy.evicts and self.budget_tokens < floor:
            raise ValueError(
                f"budget_tokens={self.budget_tokens} is below what {self.method} must keep (sink/recency: "
                f"{floor}); raise it or lower window/block_size"
            )
        return policy

    @property
    def slack(self) -> int:
        """Tokens a layer may grow past its budget while decoding before the next event."""
        return self.slack_blocks * self.block_size

    @property
    def evicts(self) -> bool:
        return self.policy.evicts

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form with the method parameters flattened; `EvictionConfig(**cfg.to_dict())`
        rebuilds it."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "method_params"}
        d.update(self.method_params)
        return d

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self.to_dict().items())))


_NO_DEFAULT = object()
#: shared fields added after rows were keyed by their configs, with the default every earlier row ran with
ADDED_SINCE_KEYED: MappingProxyType[str, Any] = MappingProxyType({"candidates": "all"})


def keyed(dumped: dict[str, Any]) -> dict[str, Any]:
    """An ``EvictionConfig`` dump (``to_dict`` or pydantic's) without the fields of :data:`ADDED_SINCE_KEYED`
    while they hold their default: what a stored row records and keys (a replay's ``config_key``), so rows stored
    before such a field existed keep their keys, and a row that ran with the default reads as they do."""
    return {k: v for k, v in dumped.items() if ADDED_SINCE_KEYED.get(k, _NO_DEFAULT) != v}


#: the fields every method shares (a job sets them once for all its methods)
SHARED_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(EvictionConfig) if f.name not in ("method", "scope", "seed", "method_params")
)

#: each field's default (``method``, ``scope``, ``density``, ``seed``, ...), read from the dataclass: the one
#: definition the job spec's defaults (``jobs.spec.JobSpec``) are built from
EVICTION_DEFAULTS: MappingProxyType[str, Any] = MappingProxyType(
    {f.name: f.default for f in fields(EvictionConfig) if f.default is not MISSING}
)

__all__ = ["ADDED_SINCE_KEYED", "CANDIDATES", "EVICTION_DEFAULTS", "SCOPES", "SHARED_FIELDS", "EvictionConfig", "keyed"]
