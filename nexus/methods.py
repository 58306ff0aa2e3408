"""The method and scope vocabulary, importable without torch.

A *method* is a name given to ``@register("name")`` in one file of ``nexus/policies/``; that decorator is the
only place a method is named. This module reads the decorators from the policy sources with ``ast`` instead
of importing them, so ``METHODS`` lists every method while ``import nexus.methods`` stays free of torch: the
service validates job files with it, and only the process that builds a policy imports the tensor code
(``nexus.policies.make_policy`` imports a method's module on first use, which runs its ``@register``).

``@register("snapkv", order=1)``: ``order`` places the method in tables and in ``METHODS`` (the paper's
Table 3 column order); methods without one follow, by name. A name registered only at run time (a test
double defined in a test module) can be built and configured but is not part of ``METHODS``.

A *scope* says when a cache evicts: ``prefill_only`` (at the end of each prefill) or ``prefill_decode``
(also while decoding, whenever a layer reaches its budget plus the slack).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

POLICIES_DIR = Path(__file__).resolve().parent / "policies"
POLICIES_PACKAGE = "nexus.policies"
DENSE = "dense"
SCOPES: tuple[str, ...] = ("prefill_only", "prefill_decode")
_UNORDERED = 1_000_000


@functools.lru_cache(maxsize=64)
def registered_nodes(tree: ast.AST) -> tuple[tuple[str, int | None, ast.ClassDef | ast.FunctionDef], ...]:
    """``(name, order, node)`` of every class or function decorated ``@register("name", order=N)`` in a parsed
    policy file (``order`` None when not given). The one reader of the decorator: :func:`_registrations` (the
    vocabulary) and ``nexus.presets`` (each method's settings, read from the same node) use it."""
    found = []
    for node in ast.walk(tree):
        for deco in getattr(node, "decorator_list", ()):
            func = deco.func if isinstance(deco, ast.Call) else None
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if name != "register" or not deco.args or not isinstance(deco.args[0], ast.Constant):
                continue
            order = next((ast.literal_eval(k.value) for k in deco.keywords if k.arg == "order"), None)
            found.append((deco.args[0].value, order, node))
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename=filename)


def parse_policy(path: Path) -> ast.Module:
    """A policy file's syntax tree, parsed once per content (the vocabulary and ``nexus.presets`` read the same
    files at import). Read-only: the tree is shared."""
    return _parse(path.read_text(encoding="utf-8"), str(path))


def _registrations(path: Path) -> list[tuple[str, int]]:
    """``(name, order)`` of every ``@register("name", order=N)`` decorator in one policy file."""
    tree = parse_policy(path)
    return [(name, _UNORDERED if order is None else order) for name, order, _ in registered_nodes(tree)]


def _discover() -> dict[str, str]:
    """method name -> module defining it, in table order."""
    entries: list[tuple[int, str, str]] = []
    for path in sorted(POLICIES_DIR.glob("*.py")):
        module = f"{POLICIES_PACKAGE}.{path.stem}"
        entries += [(order, name, module) for name, order in _registrations(path)]
    entries.sort()
    names = [name for _, name, _ in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RuntimeError(f"eviction method(s) {duplicates} are registered in more than one place")
    return {name: module for _, name, module in entries}


#: method name -> the module of ``nexus/policies/`` that registers it (read-only)
METHOD_MODULES = MappingProxyType(_discover())
#: every method, in table order (``dense`` first)
METHODS: tuple[str, ...] = tuple(METHOD_MODULES)


#: name -> policy class or factory, filled by ``@register`` as each policy module is imported
REGISTRY: dict[str, Callable[..., Any]] = {}


def register(name: str, *, order: int | None = None) -> Callable[[Any], Any]:
    """Class or factory decorator: make ``name`` buildable by ``nexus.policies.make_policy``.

    ``order`` is read from the source by :func:`_discover` (it places the method in tables).
    """

    def deco(obj: Any) -> Any:
        REGISTRY[name] = obj
        return obj

    return deco


def check_method(name: object, *, noun: str = "eviction method") -> str:
    """``name`` if it is a method (or a run-time registration), else ValueError naming the known ones."""
    if name not in METHOD_MODULES and name not in REGISTRY:
        raise ValueError(f"unknown {noun} {name!r}; known: {', '.join(METHODS)}")
    return name  # type: ignore[return-value]


def check_scope(name: object) -> str:
    """``name`` if it is a scope, else ValueError naming both."""
    if name not in SCOPES:
        raise ValueError(f"unknown scope {name!r}; use one of {', '.join(SCOPES)}")
    return name  # type: ignore[return-value]
