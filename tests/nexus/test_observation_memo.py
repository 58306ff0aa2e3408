"""Observing policies (H2O) share one observation: across the cells built from one recording (a memo of each layer's
state right after observing) and across turns (an extended recording observes only its new query rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import nexus
from nexus.attention import cache_kwarg
from nexus.methods import REGISTRY
from nexus.policies.h2o import H2O
from nexus.shared_prefill import record_prefill

SMALL = dict(window=4, block_size=4, seed=3)
#: every registered method whose policy observes, plus H2O's second state tensor (`normalize`: "seen")
OBSERVING = [m for m in nexus.METHODS if nexus.EvictionConfig(method=m).policy.observes]
VARIANTS = [(m, {}) for m in OBSERVING] + [("h2o", {"normalize": True})]
CELLS = [(d, s) for d in (0.2, 0.3, 0.5) for s in nexus.SCOPES]


def test_the_observing_methods_are_known():
    assert "h2o" in OBSERVING


@pytest.fixture
def observations(monkeypatch):
    """count(policy) -> a list that records (layer, query rows) of every `observe` of that policy's class."""

    def count(policy):
        calls: list[tuple[int, int]] = []
        original = type(policy).observe

        def observe(self, view, new_queries, new_positions):
            calls.append((view.layer_idx, new_queries.shape[2]))
            return original(self, view, new_queries, new_positions)

        monkeypatch.setattr(type(policy), "observe", observe)
        return calls

    return count


def real_prefill(model, ids, cfg):
    cache = nexus.EvictableCache(model.config, cfg)
    with torch.no_grad():
        model(input_ids=ids, **{cache_kwarg(model): cache})
    return cache


def assert_states_close(a, b, atol):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_states_close(a[key], b[key], atol)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)
    else:
        assert a == b


def assert_same_cache(a, b, state_atol):
    for layer in range(a.num_layers):
        assert torch.equal(a.retained_positions(layer), b.retained_positions(layer)), layer
        assert a.budget(layer) == b.budget(layer)
        assert_states_close(a.layers[layer].state, b.layers[layer].state, state_atol)
    assert [e.per_layer for e in a.events] == [e.per_layer for e in b.events]


def assert_same_decode(model, a, b, follow, atol, state_atol):
    """Feed `follow` to both caches one token at a time: equal logits, and equal caches after (decode events)."""
    kw = cache_kwarg(model)
    with torch.no_grad():
        for i in range(follow.shape[1]):
            la = model(input_ids=follow[:, i : i + 1], **{kw: a}).logits
            lb = model(input_ids=follow[:, i : i + 1], **{kw: b}).logits
            torch.testing.assert_close(la, lb, atol=atol, rtol=0)
    assert_same_cache(a, b, state_atol)


@pytest.mark.parametrize(("method", "params"), VARIANTS)
def test_cells_of_one_recording_share_one_observation_exactly(model64, method, params, observations):
    """Densities x scopes of one policy from one recording: only the first observes, and every cell equals a real
    prefill with its settings (states to 1e-9, positions, events, decode logits). Each cell decodes (evicting its
    own state) before the next is built, so a memo shared with a cache instead of copied would show."""
    ids = torch.randint(0, 1000, (2, 90), generator=torch.Generator().manual_seed(7))
    follow = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(8))
    cfgs = [nexus.EvictionConfig(method=method, scope=s, density=d, **SMALL, **params) for d, s in CELLS]
    recorded = record_prefill(model64, ids)
    calls = observations(cfgs[0].policy)
    for n, cfg in enumerate(cfgs):
        calls.clear()
        replayed = recorded.cache_for(cfg)
        assert calls == ([(layer, 90) for layer in range(replayed.num_layers)] if n == 0 else []), cfg
        real = real_prefill(model64, ids, cfg)
        assert real.physical_length(0) < ids.shape[1]  # it evicted: the comparison is not vacuous
        assert_same_cache(real, replayed, state_atol=1e-9)
        assert_same_decode(model64, real, replayed, follow, atol=1e-9, state_atol=1e-9)


def test_the_memo_is_keyed_by_everything_the_observation_reads(model64, observations):
    """An equal policy (built anew) reuses the observation; other policy settings or another window do not."""
    ids = torch.randint(0, 1000, (1, 60), generator=torch.Generator().manual_seed(1))
    recorded = record_prefill(model64, ids)
    calls = observations(H2O())
    layers = model64.config.num_hidden_layers

    def observed(**settings):
        calls.clear()
        recorded.cache_for(nexus.EvictionConfig(method="h2o", **{**SMALL, **settings}))
        return len(calls)

    assert observed(density=0.2) == layers
    assert observed(density=0.4, scope="prefill_only") == 0
    assert observed(budget_tokens=20) == 0
    assert observed(density=0.2, recent_ratio=0.3) == layers  # another policy
    assert observed(density=0.3, recent_ratio=0.3) == 0
    assert observed(density=0.2, normalize=True) == layers
    assert observed(density=0.2, window=8) == layers  # the view the policy observes through differs
    assert len(recorded.observed) == 4 * layers


@pytest.mark.parametrize(("method", "params"), VARIANTS)
def test_extended_recordings_equal_whole_prefills(model64, method, params, observations):
    """Three turns, each recording extending the last: each turn's cells observe only the new query rows once
    and equal a real prefill of the whole ids (acc: fp32 sums in another order)."""
    ids = torch.randint(0, 1000, (2, 150), generator=torch.Generator().manual_seed(5))
    follow = torch.randint(0, 1000, (2, 8), generator=torch.Generator().manual_seed(6))
    cfgs = [nexus.EvictionConfig(method=method, scope=s, density=d, **SMALL, **params) for d, s in CELLS[1:4]]
    calls = observations(cfgs[0].policy)
    layers = model64.config.num_hidden_layers
    recorded, before = None, 0
    for n in (60, 100, 150):
        earlier = recorded
        recorded = record_prefill(model64, ids[:, :n], logits_to_keep=1, reuse=earlier)
        assert recorded.inherited_rows == before
        calls.clear()
        caches = [recorded.cache_for(cfg) for cfg in cfgs]
        assert calls == [(layer, n - before) for layer in range(layers)]  # the new rows, once per layer
        assert not recorded.inherited  # the earlier states are let go once used
        for cfg, replayed in zip(cfgs, caches, strict=True):
            real = real_prefill(model64, ids[:, :n], cfg)
            assert real.physical_length(0) < n
            assert_same_cache(real, replayed, state_atol=1e-5)
            assert_same_decode(model64, real, replayed, follow, atol=1e-9, state_atol=1e-5)
        before = n


@dataclass(frozen=True)
class WholeRowsH2O(H2O):
    """H2O claiming its observation does not add up over rows: a recording must observe every row again."""

    observe_additive: ClassVar[bool] = False


def test_an_extension_observes_every_row_unless_the_policy_adds_up_or_the_prefix_is_whole(
    model64, observations, monkeypatch
):
    monkeypatch.setitem(REGISTRY, "h2o_whole_rows", WholeRowsH2O)
    ids = torch.randint(0, 1000, (1, 120), generator=torch.Generator().manual_seed(9))
    layers = model64.config.num_hidden_layers
    additive = nexus.EvictionConfig(method="h2o", density=0.3, **SMALL)
    whole_rows = nexus.EvictionConfig(method="h2o_whole_rows", density=0.3, **SMALL)
    calls = observations(H2O())  # WholeRowsH2O inherits H2O.observe: counted too
    earlier = record_prefill(model64, ids[:, :80], logits_to_keep=1)
    earlier.cache_for(additive), earlier.cache_for(whole_rows)
    extended = record_prefill(model64, ids, logits_to_keep=1, reuse=earlier)
    diverging = torch.cat([ids[:, :60], (ids[:, 60:100] + 1) % 1000], dim=1)  # shares 60 of the earlier 80 ids
    partial = record_prefill(model64, diverging, logits_to_keep=1, reuse=earlier)
    assert partial.inherited_rows == 0 and not partial.inherited
    for recording, cfg, rows in (
        (extended, additive, 40),
        (extended, whole_rows, 120),
        (partial, additive, 100),
    ):
        calls.clear()
        replayed = recording.cache_for(cfg)
        assert calls == [(layer, rows) for layer in range(layers)], (cfg.method, rows)
        real = real_prefill(model64, recording.ids, cfg)
        assert_same_cache(real, replayed, state_atol=1e-5)
