"""EvictableCache against plain transformers and against the masked full-forward reference.

Policies here are test doubles for the *cache* machinery (random per-head keep sets, ragged counts);
the real methods run through the same checks in test_exactness_matrix.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from transformers import DynamicCache

import nexus
from nexus.attention import cache_kwarg
from nexus.methods import REGISTRY
from nexus.policies.base import ScorePolicy
from nexus.testing import StreamRecorder, masked_reference_logits
from tests.tiny_models import tiny_qwen3


@dataclass(frozen=True)
class RandomKeep(ScorePolicy):
    """Test double: keeps a seeded random subset per KV head (plus the recency window)."""

    name: ClassVar[str] = "test_random"

    def score(self, view):
        return torch.rand(view.positions.shape, generator=view.generator, device=view.keys.device)


@dataclass(frozen=True)
class RaggedKeep(RandomKeep):
    """Test double: KV head h keeps budget - 3h slots, so heads hold different counts (padded storage)."""

    name: ClassVar[str] = "test_ragged"

    def select(self, view):
        b, h, _ = view.positions.shape
        counts = torch.tensor([max(view.window + 1, view.budget - 3 * i) for i in range(h)]).expand(b, h)
        return self.select_counts(view, counts)


@pytest.fixture(autouse=True)
def _test_doubles_known(monkeypatch):
    """Make the test-double policies buildable by name for this module's tests only (never in METHODS)."""
    monkeypatch.setitem(REGISTRY, "test_random", RandomKeep)
    monkeypatch.setitem(REGISTRY, "test_ragged", RaggedKeep)


def _stream(model, cfg, seed=1, batch=1):
    """Prefill 60, decode 30, a second 'turn' prefill of 40, decode 20: returns (recorder, ids)."""
    cache = nexus.EvictableCache(model.config, cfg)
    rec = StreamRecorder(model, cache)
    ids = torch.randint(0, 1000, (batch, 150), generator=torch.Generator().manual_seed(seed))
    rec.feed(ids[:, :60])
    for i in range(60, 90):
        rec.feed(ids[:, i : i + 1])
    rec.feed(ids[:, 90:130])
    for i in range(130, 150):
        rec.feed(ids[:, i : i + 1])
    return rec, ids


def test_dense_three_turns_equal_plain_transformers(model32):
    ids = torch.randint(0, 1000, (1, 90), generator=torch.Generator().manual_seed(0))
    turns = [ids[:, :40], ids[:, 40:41], ids[:, 41:70], ids[:, 70:71], ids[:, 71:]]
    ours, plain = nexus.EvictableCache(model32.config, nexus.EvictionConfig(method="dense")), DynamicCache()
    with torch.no_grad():
        for chunk in turns:
            a = model32(chunk, **{cache_kwarg(model32): ours}).logits
            b = model32(chunk, **{cache_kwarg(model32): plain}).logits
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        full = model32(ids).logits
    torch.testing.assert_close(a, full[:, 71:], atol=1e-4, rtol=0)
    assert ours.logical_length == 90 and ours.physical_length(0) == 90 and not ours.events


def test_dense_generate_multi_turn_equals_fresh_generate(model32):
    prompt = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(3))
    cache = nexus.EvictableCache(model32.config, nexus.EvictionConfig(method="dense"))
    out1 = model32.generate(prompt, **{cache_kwarg(model32): cache}, max_new_tokens=6, do_sample=False)
    user2 = torch.randint(0, 1000, (1, 7), generator=torch.Generator().manual_seed(4))
    out2 = model32.generate(
        torch.cat([out1, user2], 1), **{cache_kwarg(model32): cache}, max_new_tokens=6, do_sample=False
    )
    fresh = model32.generate(torch.cat([out1, user2], 1), max_new_tokens=6, do_sample=False)
    assert out2.tolist() == fresh.tolist()
    # the last sampled token of each turn is fed by the next call, so the cache is one behind the text
    assert cache.logical_length == out2.shape[1] - 1


@pytest.mark.parametrize("scope", nexus.SCOPES)
@pytest.mark.parametrize("method", ["test_random", "test_ragged"])
def test_eviction_equals_masked_full_attention_fp64(model64, method, scope):
    cfg = nexus.EvictionConfig(method=method, scope=scope, density=0.3, window=4, block_size=4)
    rec, _ = _stream(model64, cfg, batch=2)
    assert rec.cache.events, "the stream must trigger evictions"
    ours = torch.cat(rec.logits, 1)
    ref = masked_reference_logits(model64, rec)
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=0)
    # sanity: the reference is sensitive to the masks (eviction changed the logits)
    dense = model64(torch.cat(rec.chunks, 1)).logits
    assert (dense - ref).abs().max() > 1e-3


def test_eviction_exact_with_eager_kernel_fp32():
    model = tiny_qwen3(torch.float32, attn="eager")
    cfg = nexus.EvictionConfig(method="test_ragged", scope="prefill_decode", density=0.3, window=4, block_size=4)
    rec, _ = _stream(model, cfg)
    torch.testing.assert_close(torch.cat(rec.logits, 1), masked_reference_logits(model, rec), atol=1e-4, rtol=0)


def test_budget_slack_and_bytes(model32):
    cfg = nexus.EvictionConfig(
        method="test_random", scope="prefill_decode", density=0.25, window=4, block_size=4, slack_blocks=2
    )
    cache = nexus.EvictableCache(model32.config, cfg)
    ids = torch.randint(0, 1000, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model32(ids[:, :100], **{cache_kwarg(model32): cache})
        assert cache.budget(0) == 25 and cache.physical_length(0) == 25
        for i in range(100, 200):
            model32(ids[:, i : i + 1], **{cache_kwarg(model32): cache})
            for layer in range(cache.num_layers):
                assert cache.physical_length(layer) < cache.budget(layer) + cfg.slack
    assert cache.logical_length == 200
    decode_events = [e for e in cache.events if e.phase == "decode"]
    assert len(decode_events) == 100 // cfg.slack
    assert all(e.layers == cache.num_layers and e.tokens_after == 25 * cache.num_layers for e in decode_events)
    buffers = sum(t.numel() * t.element_size() for lay in cache.layers for t in (lay._k, lay._v))
    assert cache.allocated_bytes() == buffers
    # eviction really freed memory: the buffers are sized to budget + slack, not to the stream
    per_slot = 2 * model32.config.num_key_value_heads * model32.config.head_dim * 4
    assert cache.allocated_bytes() <= cache.num_layers * (25 + cfg.slack) * per_slot
    assert cache.held_bytes() == sum(cache.physical_length(i) for i in range(cache.num_layers)) * per_slot


def test_decode_chunk_ends_at_the_next_decode_event(model32):
    """decode_chunk(n): every token when no decode-time event comes (dense, prefill_only), else up to and
    including the token whose append fires the next event, as feeding one token at a time shows."""
    ids = torch.randint(0, 1000, (1, 160), generator=torch.Generator().manual_seed(1))
    for cfg in (nexus.EvictionConfig(method="dense"), nexus.EvictionConfig(method="snapkv", density=0.25)):
        cache = nexus.EvictableCache(model32.config, cfg)
        with torch.no_grad():
            model32(ids[:, :100], **{cache_kwarg(model32): cache})
        assert cache.decode_chunk(7) == 7
    cfg = nexus.EvictionConfig(method="snapkv", scope="prefill_decode", density=0.25, window=4, block_size=4)
    cache = nexus.EvictableCache(model32.config, cfg)
    with torch.no_grad():
        model32(ids[:, :100], **{cache_kwarg(model32): cache})
        chunk = cache.decode_chunk(60)
        assert 1 <= chunk < 60 and cache.decode_chunk(chunk - 1) == chunk - 1
        fed, before = 0, len(cache.events)
        while len(cache.events) == before:  # one token at a time until a decode-time event fires
            model32(ids[:, 100 + fed : 101 + fed], **{cache_kwarg(model32): cache})
            fed += 1
    assert fed == chunk


def test_retained_positions_are_logical_and_ragged_marked(model32):
    cfg = nexus.EvictionConfig(method="test_ragged", scope="prefill_only", density=0.4, window=4, block_size=4)
    cache = nexus.EvictableCache(model32.config, cfg)
    ids = torch.randint(0, 1000, (1, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model32(ids, **{cache_kwarg(model32): cache})
    pos = cache.retained_positions(0)
    assert pos.shape[:2] == (1, 2) and pos.dtype == torch.long
    counts = (pos >= 0).sum(-1)[0].tolist()
    assert counts == [32, 29] and pos.shape[-1] == 32
    assert (pos[0, 1, 29:] == -1).all() and pos[0, 0].tolist() == sorted(pos[0, 0].tolist())
    assert cache.occupancy(0) == pytest.approx(30.5)
    assert 79 in pos[0, 0].tolist()  # the recency window survives


def test_padding_is_refused(model32):
    cache = nexus.EvictableCache(model32.config, nexus.EvictionConfig(method="test_random", window=4, block_size=4))
    ids = torch.randint(0, 1000, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    with pytest.raises(ValueError, match="padded"):
        model32(ids, attention_mask=mask, **{cache_kwarg(model32): cache})


def test_prepare_is_idempotent_and_keeps_kernel(model32):
    assert nexus.prepare(model32) is model32
    assert model32.config._attn_implementation == "nexus_sdpa"
    plain = model32(
        torch.arange(10).view(1, -1), **{cache_kwarg(model32): DynamicCache()}
    ).logits  # pass-through for other caches
    assert torch.isfinite(plain).all()
