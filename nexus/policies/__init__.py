"""Eviction policies, one per file, each named once by ``@register`` (see ``nexus.methods``).

A method's module is imported on first use, so a policy file can be read (and fail) on its own.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from nexus.methods import METHOD_MODULES, REGISTRY, check_method
from nexus.policies.base import LayerView, Policy, ScorePolicy


def make_policy(method: str, **params: Any) -> Policy:
    """Build the policy for ``method`` with its hyperparameters; unknown names or values raise ValueError."""
    if method not in REGISTRY:
        check_method(method)
        importlib.import_module(METHOD_MODULES[method])
    factory = REGISTRY[method]
    try:
        return factory(**params)
    except TypeError as exc:  # an unknown or missing keyword
        try:
            known = ", ".join(policy_settings(factory())) or "none"
        except (TypeError, ValueError):  # a factory without defaults: its signature is all we know
            known = "see its docstring"
        raise ValueError(f"bad parameters for method {method!r}: {exc}. Known parameters: {known}") from exc


def policy_settings(policy: Policy) -> dict[str, Any]:
    """Every hyperparameter of a built policy, by name (an Ada policy: its own, then its inner policy's)."""
    inner = getattr(policy, "inner", None)
    if isinstance(inner, Policy):
        own = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name != "inner"}
        return {**own, **policy_settings(inner)}
    if dataclasses.is_dataclass(policy):
        return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
    return {}


__all__ = ["LayerView", "Policy", "ScorePolicy", "make_policy", "policy_settings"]
