"""Named settings per method: ``paper`` (ours, the default), ``reference`` and ``kvcache_factory``.

The Nexus paper gives its own hyperparameters (b = 32, W = 16, H = 3, lambda = 0.5, n = 5) but not the
baselines' windows, pooling, H2O split or eviction interval; every reference implementation fixes those
differently. A preset names one consistent choice for every method, and a job can still override any single
value per method (``method_params``). Importing this module needs no torch.

- ``paper``: what this library does by default: every method's dataclass defaults (:data:`PAPER`, read from the
  policy sources, so a default is written once, in its policy's dataclass) and ``EvictionConfig``'s shared ones.
- ``reference``: each method's own repository, as published (the commits read are in
  ../shared/reference/kv-eviction.md and each policy's docstring):
  SnapKV (FasterDecoding/SnapKV, the paper's LongBench configs ``*_w32_k7_maxpool``): W = 32, kernel 7, max.
  PyramidKV (Zefan-Cai/KVCache-Factory ``run_longbench.py``): W = 8, kernel 7, max, beta = 20.
  Ada-SnapKV / Ada-PyramidKV (FFY0/AdaKV, ``config_compress`` with ``pred.py``'s alpha): W = 32, kernel 7,
  max, floor_alpha = 0.2, no normalisation.
  H2O (FMInference/H2O): heavy 0.1 / recent 0.1 of the prompt (recent_ratio 0.5), raw accumulated attention,
  evicting at every decode step (``slack_blocks = 0``).
  MorphKV (ghadiaravi13/MorphKV scripts): W = 3, max fusion, evicting at every decode step.
  StreamingLLM: 4 sinks, a rolling cache that evicts at every decode step.
  Nexus / Ada-Nexus: the paper is their reference, so the values are ``paper``'s.
- ``kvcache_factory``: the one harness most baseline numbers in the literature come from
  (KVCache-Factory ``run_longbench.py`` / ``init_*``): W = 8, kernel 7, max pooling for SnapKV, PyramidKV,
  H2O and the Ada methods; H2O keeps only the last W tokens as its recency part; Ada normalises the
  scores (``init_adakv``) with floor_alpha 0.2.

Precedence when a job resolves a method's settings (lowest first): the library defaults, the job's shared
``eviction`` block, the preset's values for the method, the job's ``method_params`` for the method.
A preset value is either a shared ``EvictionConfig`` field (``window``, ``slack_blocks``) or one of the
method's own hyperparameters.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nexus.methods import POLICIES_DIR, parse_policy, registered_nodes

#: the preset names, default first
PRESETS: tuple[str, ...] = ("paper", "reference", "kvcache_factory")
DEFAULT_PRESET = "paper"

#: EvictionConfig fields a method may set for itself (the others are the job's: method, scope, density, seed)
PER_METHOD_SHARED_FIELDS: tuple[str, ...] = ("window", "block_size", "slack_blocks", "budget_tokens", "candidates")

#: the arithmetic a default may use besides a plain literal (``chunk_elements: int = 2**27``)
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}
_REQUIRED = object()  # a field without a default


def _literal(node: ast.expr, where: str) -> Any:
    """The value of a default written as a literal (or literal arithmetic); ValueError naming ``where`` else."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_literal(node.left, where), _literal(node.right, where))
    raise ValueError(
        f"{where}: a policy setting's default must be a literal (it is read without torch), got {ast.unparse(node)!r}"
    )


def _class_fields(name: str, classes: dict[str, ast.ClassDef]) -> dict[str, Any]:
    """A policy dataclass's fields (its bases' first), each its default or ``_REQUIRED``; ClassVars are not fields."""
    node = classes.get(name)
    if node is None:  # a base from outside nexus/policies (object): no fields
        return {}
    found: dict[str, Any] = {}
    for base in node.bases:
        found.update(_class_fields(getattr(base, "id", None) or getattr(base, "attr", ""), classes))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" in ast.unparse(stmt.annotation):
                continue
            where = f"{name}.{stmt.target.id}"
            found[stmt.target.id] = _REQUIRED if stmt.value is None else _literal(stmt.value, where)
    return found


def source_defaults(policies_dir: Path = POLICIES_DIR) -> dict[str, dict[str, Any]]:
    """Every registered method's settings with their defaults, read from the policy sources with ``ast`` (no torch),
    in the order ``nexus.policies.policy_settings`` lists them for a built policy:

    - a registered dataclass: its fields (its bases' first), each of which must have a default;
    - a registered factory function (a composition, e.g. ``ada_snapkv``): the fields with a default of the class
      its return annotation names (``-> AdaKV``: ``floor_alpha``, ``normalize``), its own keyword defaults, then
      the settings of the method its ``**<method>_params`` names (``**snapkv_params``: SnapKV's).
    """
    classes: dict[str, ast.ClassDef] = {}
    registered: dict[str, ast.ClassDef | ast.FunctionDef] = {}
    order: dict[str, float] = {}
    for path in sorted(Path(policies_dir).glob("*.py")):
        tree = parse_policy(path)
        classes.update({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)})
        for name, place, node in registered_nodes(tree):
            registered[name], order[name] = node, float("inf") if place is None else place

    def settings(method: str) -> dict[str, Any]:
        node = registered[method]
        if isinstance(node, ast.ClassDef):
            found = _class_fields(node.name, classes)
            required = [k for k, v in found.items() if v is _REQUIRED]
            if required:
                raise ValueError(
                    f"{method}: every setting needs a default (the paper preset holds it); {node.name} has none "
                    f"for {required}"
                )
            return found
        returned = getattr(node.returns, "id", None) or getattr(node.returns, "attr", "")
        found = {k: v for k, v in _class_fields(returned, classes).items() if v is not _REQUIRED}
        args = node.args.posonlyargs + node.args.args
        for arg, default in zip(args[len(args) - len(node.args.defaults) :], node.args.defaults, strict=True):
            found[arg.arg] = _literal(default, f"{node.name}({arg.arg})")
        for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True):
            if default is not None:
                found[arg.arg] = _literal(default, f"{node.name}({arg.arg})")
        inner = node.args.kwarg.arg.removesuffix("_params") if node.args.kwarg is not None else None
        if inner is not None and inner in registered:
            found.update(settings(inner))
        return found

    return {method: settings(method) for method in sorted(registered, key=lambda m: (order[m], m))}  # table order


#: every hyperparameter of every method with its default: the ``paper`` preset. Derived from the policy dataclasses
#: (:func:`source_defaults`), which are the one place a default is written; tests/nexus/test_presets.py holds
#: the paper's published values against it.
PAPER: MappingProxyType[str, dict[str, Any]] = MappingProxyType(source_defaults())

#: what each non-default preset changes, per method (shared fields included)
_CHANGES: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {},
    "reference": {
        "snapkv": {"window": 32},
        "pyramidkv": {"window": 8},
        "ada_snapkv": {"window": 32},
        "ada_pyramidkv": {"window": 32},
        "h2o": {"slack_blocks": 0},
        "morphkv": {"window": 3, "slack_blocks": 0},
        "streaming_llm": {"slack_blocks": 0},
    },
    "kvcache_factory": {
        "snapkv": {"window": 8},
        "pyramidkv": {"window": 8},
        "ada_snapkv": {"window": 8, "normalize": True},
        "ada_pyramidkv": {"window": 8, "normalize": True},
        "h2o": {"window": 8, "recent_rule": "window"},
    },
}


#: Settings a method gained after jobs were stored with its resolved settings: a stored setting set without the key
#: ran with the value here, not with today's default (every stored job and episode holds its methods' whole resolved
#: settings, so a missing key means "stored before it existed"). Nexus filled its budget's leftover (< one block)
#: with nothing until ``leftover`` was added (issue 31).
ADDED_SINCE_STORED: MappingProxyType[str, dict[str, Any]] = MappingProxyType(
    {"nexus": {"leftover": "unused"}, "ada_nexus": {"leftover": "unused"}}
)


def stored_settings(method: str, settings: dict[str, Any]) -> dict[str, Any]:
    """A method's settings as a stored job or episode holds them, with the values it ran with for the settings it
    predates (:data:`ADDED_SINCE_STORED`)."""
    return {**ADDED_SINCE_STORED.get(method, {}), **settings}


def check_preset(name: object) -> str:
    """``name`` if it is a preset, else ValueError naming the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return name  # type: ignore[return-value]


def known_settings(method: str) -> tuple[str, ...]:
    """Every name a job may set for ``method``: the per-method shared fields and its own hyperparameters."""
    return PER_METHOD_SHARED_FIELDS + tuple(PAPER.get(method, {}))


def preset_settings(method: str, preset: str = DEFAULT_PRESET) -> dict[str, Any]:
    """``method``'s settings under ``preset``: all its hyperparameters, plus any shared field it changes.

    A method the presets do not know (a run-time registration, e.g. a test double) gets only what the
    preset says for it, which is nothing: its dataclass defaults apply.
    """
    check_preset(preset)
    return {**PAPER.get(method, {}), **_CHANGES[preset].get(method, {})}


def resolve(method: str, preset: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The preset's settings for ``method`` with the job's ``overrides`` on top. ValueError for a name the
    method does not have (the message names the method and the field)."""
    overrides = dict(overrides or {})
    if method in PAPER:
        unknown = sorted(set(overrides) - set(known_settings(method)))
        if unknown:
            raise ValueError(f"{method}: unknown setting(s) {unknown}; known: {', '.join(known_settings(method))}")
    return {**preset_settings(method, preset), **overrides}


def split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(shared EvictionConfig fields, the method's own hyperparameters) of a resolved settings mapping."""
    shared = {k: v for k, v in settings.items() if k in PER_METHOD_SHARED_FIELDS}
    return shared, {k: v for k, v in settings.items() if k not in PER_METHOD_SHARED_FIELDS}
