"""Presets: complete, equal to the library's defaults where they say so, and buildable for every method."""

from __future__ import annotations

import pytest

import nexus
from nexus.config import SHARED_FIELDS
from nexus.methods import METHODS
from nexus.policies import make_policy, policy_settings
from nexus.presets import PAPER, PER_METHOD_SHARED_FIELDS, PRESETS, preset_settings, resolve


def test_every_method_has_a_complete_paper_preset_equal_to_its_defaults():
    """`paper` lists every hyperparameter of every method with the dataclass default, so a stored job holds
    complete settings and a changed default cannot silently change what `paper` means."""
    assert set(PAPER) == set(METHODS)
    for method in METHODS:
        assert policy_settings(make_policy(method)) == PAPER[method], method


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
