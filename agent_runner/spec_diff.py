"""What a nested JSON mapping changed from another: the episode's spec as the worker ran it, stored as what it
changed from the episode's stored config (``episodes.config``) instead of a second copy of all of it.

``changes(base, new)`` -> ``{"set": {dotted path: value}, "removed": [dotted paths]}`` (paths name leaves: a
mapping is descended into, anything else is a value, lists included); ``apply(base, changes)`` rebuilds ``new``
exactly: ``apply(a, changes(a, b)) == b`` for any JSON mappings ``a`` and ``b`` whose keys hold no ``.``
(``tests/agent_runner/test_spec_diff.py``). A key with a ``.`` is stored whole under its nearest dot-free parent.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def _walk(base: Mapping[str, Any], new: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    for key in new:
        path = f"{prefix}{key}"
        old_value, new_value = base.get(key, _MISSING), new[key]
        if isinstance(old_value, Mapping) and isinstance(new_value, Mapping) and _plain(old_value, new_value):
            _walk(old_value, new_value, f"{path}.", out)
        elif old_value is _MISSING or old_value != new_value or type(old_value) is not type(new_value):
            out["set"][path] = copy.deepcopy(new_value)
    out["removed"].extend(f"{prefix}{key}" for key in base if key not in new)


def _plain(*mappings: Mapping[str, Any]) -> bool:
    """Whether every key of these mappings can be a path segment."""
    return all("." not in str(key) for m in mappings for key in m)


_MISSING = object()


def changes(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The leaves ``new`` sets differently from ``base`` and the paths it removes."""
    if not _plain(base, new):
        raise ValueError("top-level keys must not contain '.'")
    out: dict[str, Any] = {"set": {}, "removed": []}
    _walk(base, new, "", out)
    return out


def apply(base: Mapping[str, Any], diff: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``diff`` (from :func:`changes`) applied: the ``new`` it was taken from."""
    out = copy.deepcopy(dict(base))
    for path in diff.get("removed", []):
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            node = node[part]
        del node[leaf]
    for path, value in diff.get("set", {}).items():
        *parents, leaf = path.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return out
