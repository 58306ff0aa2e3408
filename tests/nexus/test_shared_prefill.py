"""A recorded dense prefill replayed into a method's cache equals a real prefill with that method."""

from __future__ import annotations

import pytest
import torch

import nexus
from nexus.attention import cache_kwarg
from nexus.shared_prefill import record_prefill
from tests.nexus.unlabelled import evicting

SMALL = dict(density=0.3, window=4, block_size=4, seed=3)


@pytest.mark.parametrize("scope", nexus.SCOPES)
@pytest.mark.parametrize("method", nexus.METHODS)
def test_replayed_prefill_equals_real_prefill(model64, method, scope):
    ids = torch.randint(0, 1000, (2, 90), generator=torch.Generator().manual_seed(7))
    follow = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(8))
    cfg = nexus.EvictionConfig(method=method, scope=scope, **SMALL, **evicting(method))
    kw = cache_kwarg(model64)

    real = nexus.EvictableCache(model64.config, cfg)
    with torch.no_grad():
        real_prefill = model64(input_ids=ids, **{kw: real}).logits
    recorded = record_prefill(model64, ids)
    replayed = recorded.cache_for(cfg)

    torch.testing.assert_close(recorded.logits, real_prefill, atol=0, rtol=0)
    for layer in range(real.num_layers):
        assert torch.equal(real.retained_positions(layer), replayed.retained_positions(layer)), layer
        torch.testing.assert_close(replayed.layers[layer].keys, real.layers[layer].keys, atol=0, rtol=0)
        assert replayed.budget(layer) == real.budget(layer)
    if cfg.evicts:  # the probe would be vacuous if nothing was evicted
        assert real.physical_length(0) < ids.shape[1]
    with torch.no_grad():  # and both carry on identically: decode steps, eviction events included
        for i in range(follow.shape[1]):
            a = model64(input_ids=follow[:, i : i + 1], **{kw: real}).logits
            b = model64(input_ids=follow[:, i : i + 1], **{kw: replayed}).logits
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert [e.per_layer for e in real.events] == [e.per_layer for e in replayed.events]


@pytest.mark.parametrize("method", ["snapkv", "h2o", "nexus"])
def test_a_prefill_extending_an_earlier_recording_equals_a_whole_prefill(model64, method):
    """A conversation re-prefilled one turn later: the shared history is taken from the earlier recording."""
    ids = torch.randint(0, 1000, (1, 120), generator=torch.Generator().manual_seed(5))
    earlier = record_prefill(model64, ids[:, :70], logits_to_keep=1)
    extended = record_prefill(model64, ids, logits_to_keep=1, reuse=earlier)
    whole = record_prefill(model64, ids, logits_to_keep=1)
    assert extended.logits.shape == whole.logits.shape == (1, 1, model64.config.vocab_size)
    torch.testing.assert_close(extended.logits, whole.logits, atol=1e-4, rtol=1e-4)
    for (qa, ka, va, _), (qb, kb, vb, _) in zip(extended.layers, whole.layers, strict=True):
        for a, b in ((qa, qb), (ka, kb), (va, vb)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    cfg = nexus.EvictionConfig(method=method, **SMALL, **evicting(method))
    a, b = extended.cache_for(cfg), whole.cache_for(cfg)
    assert all(torch.equal(a.retained_positions(i), b.retained_positions(i)) for i in range(a.num_layers))
    # a recording of other ids is not reused (nothing shared: a whole prefill)
    other = ids[:, :80].clone()
    other[0, 0] = (other[0, 0] + 1) % 1000
    assert record_prefill(model64, other, logits_to_keep=1, reuse=earlier).layers[0][1].shape[2] == 80
    torch.testing.assert_close(
        record_prefill(model64, other, logits_to_keep=1, reuse=earlier).logits,
        record_prefill(model64, other, logits_to_keep=1).logits,
        atol=0,
        rtol=0,
    )
