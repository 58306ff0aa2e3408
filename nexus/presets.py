"""Named settings per method: ``paper`` (ours, the default), ``reference`` and ``kvcache_factory``.

The Nexus paper gives its own hyperparameters (b = 32, W = 16, H = 3, lambda = 0.5, n = 5) but not the
baselines' windows, pooling, H2O split or eviction interval; every reference implementation fixes those
differently. A preset names one consistent choice for every method, and a job can still override any single
value per method (``method_params``). Importing this module needs no torch.

- ``paper``: what this library does by default (every method's dataclass defaults, the shared W = 16).
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

from types import MappingProxyType
from typing import Any

#: the preset names, default first
PRESETS: tuple[str, ...] = ("paper", "reference", "kvcache_factory")
DEFAULT_PRESET = "paper"

#: EvictionConfig fields a method may set for itself (the others are the job's: method, scope, density, seed)
PER_METHOD_SHARED_FIELDS: tuple[str, ...] = ("window", "block_size", "slack_blocks", "budget_tokens")

_SNAPKV = {"kernel_size": 7, "pooling": "max", "pool_per_query_head": False}
_PYRAMIDKV = {**_SNAPKV, "beta": 20, "cap_to_length": True}
_ADA = {"floor_alpha": 0.2, "normalize": False}
_NEXUS = {
    "walk_steps": 3,
    "lam": 0.5,
    "eps_tie": 1e-6,
    "reservoir_n": 5,
    "walk_rows": "recent",
    "weight_scale": "raw",
    "head_scores": "averaged",
    "leftover": "partial_block",
}

#: every hyperparameter of every method, with the library's default (a test checks them against the policies)
PAPER: MappingProxyType[str, dict[str, Any]] = MappingProxyType(
    {
        "dense": {},
        "snapkv": _SNAPKV,
        "pyramidkv": _PYRAMIDKV,
        "ada_snapkv": {**_ADA, **_SNAPKV},
        "ada_pyramidkv": {**_ADA, **_PYRAMIDKV},
        "h2o": {
            "recent_rule": "ratio",
            "recent_ratio": 0.5,
            "normalize": False,
            "chunk_rows": 512,
            "chunk_elements": 2**27,
        },
        "morphkv": {"fusion": "max"},
        "streaming_llm": {"n_sink": 4},
        "nexus": _NEXUS,
        "ada_nexus": {**_ADA, **_NEXUS},
    }
)

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
