"""``agent_runner.spec_diff``: a spec stored as what it changed from the episode's config rebuilds exactly."""

from __future__ import annotations

import random

import pytest

from agent_runner.spec_diff import apply, changes


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.choice(["dict", "dict", "list", "int", "float", "str", "bool", "none"] if depth < 3 else ["int", "str"])
    if kind == "dict":
        return {rng.choice("abcde") + str(i): _random_json(rng, depth + 1) for i in range(rng.randrange(4))}
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {"int": rng.randrange(3), "float": float(rng.randrange(3)), "str": rng.choice("xy"), "bool": True}.get(kind)


def test_changes_applied_rebuild_the_new_mapping_exactly():
    rng = random.Random(35)
    for _ in range(500):
        a, b = _random_json(rng), _random_json(rng)
        a, b = (x if isinstance(x, dict) else {"v": x} for x in (a, b))
        rebuilt = apply(a, changes(a, b))
        assert rebuilt == b and repr(rebuilt) == repr(b)  # 1 and 1.0, True and 1 told apart


def test_only_what_changed_is_stored():
    config = {"model": {"name": "tiny", "device": "auto"}, "grade": True, "agent": {"max_steps": 3}, "old": 1}
    ran = {"model": {"name": "tiny", "device": "cpu"}, "grade": False, "agent": {"max_steps": 3}, "new": [1]}
    assert changes(config, ran) == {"set": {"model.device": "cpu", "grade": False, "new": [1]}, "removed": ["old"]}
    assert apply(config, changes(config, ran)) == ran and config["model"]["device"] == "auto"  # base untouched


def test_keys_with_dots_are_stored_whole():
    a, b = {"p": {"x.y": 1}}, {"p": {"x.y": 2}}
    assert changes(a, b) == {"set": {"p": {"x.y": 2}}, "removed": []}
    assert apply(a, changes(a, b)) == b
    with pytest.raises(ValueError, match="'.'"):
        changes({"a.b": 1}, {})
