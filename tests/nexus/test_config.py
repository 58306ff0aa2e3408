"""EvictionConfig and the budget rule: validation and the one place the budget is computed."""

from __future__ import annotations

import math

import pytest
import torch

import nexus


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(method="topk_magic"), "unknown eviction method"),
        (dict(scope="sometimes"), "unknown scope"),
        (dict(density=0.0), "density"),
        (dict(density=1.5), "density"),
        (dict(density=float("nan")), "density"),
        (dict(density=True), "density"),
        (dict(density="0.2"), "density"),
        (dict(block_size=0), "block_size"),
        (dict(window=2.5), "window"),
        (dict(slack_blocks=-1), "slack_blocks"),
        (dict(budget_tokens=0), "budget_tokens"),
        (dict(method="nexus", budget_tokens=40), "below what nexus must keep"),
        (dict(method="nexus", walk_stepz=3), "bad parameters for method 'nexus'"),
        (dict(method="snapkv", kernel_size=4), "kernel_size"),
        (dict(method="nexus", lam=-1.0), "lam"),
        (dict(method="ada_snapkv", floor_alpha=1.5), "floor_alpha"),
        (dict(seed="zero"), "seed"),
    ],
)
def test_bad_values_are_clear_errors(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        nexus.EvictionConfig(**kwargs)


def test_defaults_are_the_papers():
    cfg = nexus.EvictionConfig()
    assert (cfg.method, cfg.scope, cfg.density, cfg.block_size, cfg.window, cfg.seed) == (
        "nexus",
        "prefill_decode",
        0.2,
        32,
        16,
        0,
    )
    p = cfg.policy
    assert (p.walk_steps, p.lam, p.eps_tie, p.reservoir_n) == (3, 0.5, 1e-6, 5)
    assert cfg.slack == 32


def test_round_trip_and_hash():
    cfg = nexus.EvictionConfig(method="nexus", density=0.3, lam=0.25)
    again = nexus.EvictionConfig(**cfg.to_dict())
    assert again == cfg and hash(again) == hash(cfg)
    assert again.policy.lam == 0.25


@pytest.mark.parametrize("length", [1, 100, 640, 8192, 65536])
def test_prefill_budget_rule(length):
    cfg = nexus.EvictionConfig(method="snapkv", density=0.2)
    assert nexus.prefill_budget(cfg, length) == max(math.ceil(0.2 * length), cfg.policy.min_budget(16, 32))
    fixed = nexus.EvictionConfig(method="snapkv", budget_tokens=1638)
    assert nexus.prefill_budget(fixed, length) == 1638


def test_should_evict_by_scope_and_phase():
    po = nexus.EvictionConfig(method="snapkv", scope="prefill_only")
    pd = nexus.EvictionConfig(method="snapkv", scope="prefill_decode")
    dense = nexus.EvictionConfig(method="dense")
    assert nexus.should_evict(po, phase="prefill", occupancy=101, budget=100)
    assert not nexus.should_evict(po, phase="decode", occupancy=10_000, budget=100)
    assert not nexus.should_evict(pd, phase="decode", occupancy=131, budget=100)
    assert nexus.should_evict(pd, phase="decode", occupancy=132, budget=100)
    assert not nexus.should_evict(dense, phase="prefill", occupancy=10_000, budget=1)


def test_cache_rejects_a_different_batch_shape(model32):
    cache = nexus.EvictableCache(model32.config, nexus.EvictionConfig(method="dense"))
    kw = nexus.cache_kwarg(model32)
    with torch.no_grad():
        model32(torch.zeros(1, 5, dtype=torch.long), **{kw: cache})
        with pytest.raises(ValueError, match="fresh EvictableCache"):
            model32(torch.zeros(2, 1, dtype=torch.long), **{kw: cache})


def test_crop_is_refused(model32):
    cache = nexus.EvictableCache(model32.config, nexus.EvictionConfig(method="snapkv"))
    with pytest.raises(NotImplementedError):
        cache.crop(3)
