"""Presets: the `paper` preset is the paper's published settings, complete, derived from the one place each default
is written (the policy dataclasses), and every preset builds every method."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import nexus
from nexus.config import EVICTION_DEFAULTS, SHARED_FIELDS
from nexus.methods import METHODS, POLICIES_DIR
from nexus.policies import make_policy, policy_settings
from nexus.presets import PAPER, PER_METHOD_SHARED_FIELDS, PRESETS, preset_settings, resolve, source_defaults

#: The Nexus Sampling paper's published settings (section 5.1, "Implementation details": b = 32, W = 16, H = 3,
#: lambda = 0.5, eps_tie = 1e-6, n = 5, a fixed random seed, at 80% eviction; ../shared/reference/nexus-sampling.md),
#: written out here as the external reference the library's defaults are held against.
PUBLISHED_SHARED = {"density": 0.2, "block_size": 32, "window": 16}
PUBLISHED_NEXUS = {"walk_steps": 3, "lam": 0.5, "eps_tie": 1e-6, "reservoir_n": 5}

#: The whole `paper` preset. The paper gives Nexus's values above and none of the baselines': theirs are this
#: library's documented choices (docs/methods.md, "Per-method settings and presets"), written out so that a changed
#: default is a visible change of what `paper` means (a stored job holds its resolved settings).
_SNAPKV = {"kernel_size": 7, "pooling": "max", "pool_per_query_head": False}
_PYRAMIDKV = {**_SNAPKV, "beta": 20, "cap_to_length": True}
_ADA = {"floor_alpha": 0.2, "normalize": False}
_NEXUS = {
    **PUBLISHED_NEXUS,
    "walk_rows": "recent",
    "weight_scale": "raw",
    "head_scores": "averaged",
    "leftover": "partial_block",
}
PAPER_PRESET = {
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
    # The Complexity Trap (arXiv 2508.21433): the latest M = 10 observations kept, SWE-agent's placeholder
    "observation_masking": {
        "rule": "latest",
        "keep_latest": 10,
        "placeholder": "Old environment output: ({lines} lines omitted)",
    },
}


def test_the_paper_preset_is_the_papers_published_settings():
    """The library's defaults (EvictionConfig's shared fields, every policy's hyperparameters) are the paper's,
    complete for every method, and what a policy built without arguments holds."""
    assert {k: EVICTION_DEFAULTS[k] for k in PUBLISHED_SHARED} == PUBLISHED_SHARED
    assert (EVICTION_DEFAULTS["seed"], EVICTION_DEFAULTS["method"]) == (0, "nexus")  # a fixed seed; ours is 0
    for method in ("nexus", "ada_nexus"):
        assert {k: PAPER[method][k] for k in PUBLISHED_NEXUS} == PUBLISHED_NEXUS, method
    assert dict(PAPER) == PAPER_PRESET
    assert tuple(PAPER) == METHODS
    for method in METHODS:
        assert policy_settings(make_policy(method)) == PAPER_PRESET[method], method
    cfg = nexus.EvictionConfig.from_preset("nexus")
    assert {k: getattr(cfg, k) for k in PUBLISHED_SHARED} == PUBLISHED_SHARED
    assert policy_settings(cfg.policy) == PAPER_PRESET["nexus"]


def test_the_paper_preset_is_read_from_the_policy_dataclasses(tmp_path):
    """`PAPER` restates no default: it is read from the policy sources (without torch), so a default changed in its
    dataclass (or a new method's file) changes `paper` with nothing else to edit."""
    assert source_defaults() == dict(PAPER)
    copy = tmp_path / "policies"
    shutil.copytree(POLICIES_DIR, copy)
    nexus_py = copy / "nexus.py"
    text = nexus_py.read_text(encoding="utf-8")
    assert text.count("    walk_steps: int = 3\n") == 1
    nexus_py.write_text(text.replace("    walk_steps: int = 3\n", "    walk_steps: int = 4\n"), encoding="utf-8")
    ada_py = copy / "ada.py"
    text = ada_py.read_text(encoding="utf-8")
    assert text.count("    floor_alpha: float = 0.2\n") == 1  # AdaKV's field: the one place, for all three ada_*
    ada_py.write_text(
        text.replace("    floor_alpha: float = 0.2\n", "    floor_alpha: float = 0.3\n"), encoding="utf-8"
    )
    (copy / "mine.py").write_text(
        "from dataclasses import dataclass\nfrom nexus.methods import register\nfrom nexus.policies.snapkv import "
        "SnapKV\n\n\n@register('mine')\n@dataclass(frozen=True)\nclass Mine(SnapKV):\n    k: int = 2**3\n",
        encoding="utf-8",
    )
    changed = source_defaults(copy)
    assert changed["nexus"]["walk_steps"] == changed["ada_nexus"]["walk_steps"] == 4
    assert {changed[m]["floor_alpha"] for m in ("ada_snapkv", "ada_pyramidkv", "ada_nexus")} == {0.3}
    assert changed["mine"] == {**PAPER["snapkv"], "k": 8}
    assert {
        m: v for m, v in changed.items() if m not in ("nexus", "ada_nexus", "ada_snapkv", "ada_pyramidkv", "mine")
    } == {m: v for m, v in PAPER.items() if m not in ("nexus", "ada_nexus", "ada_snapkv", "ada_pyramidkv")}


def test_a_default_the_source_reader_cannot_read_is_an_error(tmp_path):
    (tmp_path / "odd.py").write_text(
        "from dataclasses import dataclass\nfrom nexus.methods import register\n\n\n@register('odd')\n"
        "@dataclass(frozen=True)\nclass Odd:\n    k: int = len('ab')\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=r"Odd.k: a policy setting's default must be a literal"):
        source_defaults(tmp_path)
    (tmp_path / "odd.py").write_text(
        "from dataclasses import dataclass\nfrom nexus.methods import register\n\n\n@register('odd')\n"
        "@dataclass(frozen=True)\nclass Odd:\n    k: int\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=r"odd: every setting needs a default"):
        source_defaults(tmp_path)


def test_the_presets_import_without_torch():
    code = "import sys, nexus.presets; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", METHODS)
def test_every_preset_builds_every_method(preset, method):
    cfg = nexus.EvictionConfig.from_preset(method, preset)
    settings = preset_settings(method, preset)
    for name in PER_METHOD_SHARED_FIELDS:
        if name in settings:
            assert getattr(cfg, name) == settings[name]
    own = {k: v for k, v in settings.items() if k not in SHARED_FIELDS}
    assert policy_settings(cfg.policy) == own


def test_reference_values_are_the_published_ones():
    ref = {m: preset_settings(m, "reference") for m in METHODS}
    assert (ref["snapkv"]["window"], ref["snapkv"]["kernel_size"], ref["snapkv"]["pooling"]) == (32, 7, "max")
    assert (ref["pyramidkv"]["window"], ref["pyramidkv"]["beta"]) == (8, 20)
    assert (ref["ada_snapkv"]["floor_alpha"], ref["ada_snapkv"]["normalize"], ref["ada_snapkv"]["window"]) == (
        0.2,
        False,
        32,
    )
    assert (ref["h2o"]["recent_rule"], ref["h2o"]["recent_ratio"], ref["h2o"]["slack_blocks"]) == ("ratio", 0.5, 0)
    assert (ref["morphkv"]["window"], ref["morphkv"]["fusion"], ref["morphkv"]["slack_blocks"]) == (3, "max", 0)
    assert ref["nexus"] == PAPER["nexus"] and ref["ada_nexus"] == PAPER["ada_nexus"]
    kvf = {m: preset_settings(m, "kvcache_factory") for m in METHODS}
    assert (kvf["h2o"]["recent_rule"], kvf["h2o"]["window"]) == ("window", 8)
    assert kvf["ada_pyramidkv"]["normalize"] is True and kvf["ada_pyramidkv"]["floor_alpha"] == 0.2


def test_overrides_win_and_unknown_names_are_refused():
    assert resolve("snapkv", "reference", {"window": 4})["window"] == 4
    assert nexus.EvictionConfig.from_preset("snapkv", "reference", window=4).window == 4
    with pytest.raises(ValueError, match=r"snapkv: unknown setting\(s\) \['kernel'\]"):
        resolve("snapkv", "paper", {"kernel": 3})
    with pytest.raises(ValueError, match="unknown preset 'best'"):
        preset_settings("snapkv", "best")
    with pytest.raises(ValueError, match="Known parameters: floor_alpha, normalize, kernel_size"):
        make_policy("ada_snapkv", kernel=3)
