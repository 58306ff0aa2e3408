"""Eviction policies, one per file, selected by name.

Modules are imported on first use so a policy file can be read (and fail) on its own.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from nexus.policies.base import LayerView, Policy, ScorePolicy

#: method name -> module defining it. `ada_*` are Ada-KV head-adaptive budgets around another scorer.
METHODS: dict[str, str] = {
    "dense": "nexus.policies.dense",
    "streaming_llm": "nexus.policies.streaming_llm",
    "snapkv": "nexus.policies.snapkv",
    "pyramidkv": "nexus.policies.pyramidkv",
    "h2o": "nexus.policies.h2o",
    "morphkv": "nexus.policies.morphkv",
    "nexus": "nexus.policies.nexus",
    "ada_snapkv": "nexus.policies.ada",
    "ada_pyramidkv": "nexus.policies.ada",
    "ada_nexus": "nexus.policies.ada",
}

_REGISTRY: dict[str, Any] = {}


def register(name: str):
    """Class or factory decorator: make `name` constructible by `make_policy`."""

    def deco(obj):
        _REGISTRY[name] = obj
        return obj

    return deco


def make_policy(method: str, **params: Any) -> Policy:
    """Build the policy for `method` with its hyperparameters; unknown names or values raise ValueError."""
    if method not in METHODS:
        raise ValueError(f"unknown eviction method {method!r}; known: {', '.join(METHODS)}")
    if method not in _REGISTRY:
        importlib.import_module(METHODS[method])
    factory = _REGISTRY[method]
    try:
        return factory(**params)
    except TypeError as exc:  # an unknown or missing keyword
        known = ", ".join(f.name for f in dataclasses.fields(factory)) if dataclasses.is_dataclass(factory) else ""
        raise ValueError(f"bad parameters for method {method!r}: {exc}. Known parameters: {known}") from exc


__all__ = ["METHODS", "LayerView", "Policy", "ScorePolicy", "make_policy", "register"]
