"""KV memory figures (nexus.memory): bytes held = valid entries x bytes per entry, bytes allocated = the buffers,
and the peaks sampled after every layer's append and every eviction (a prefill's pre-eviction state included)."""

from __future__ import annotations

import pytest
import torch

import nexus
from nexus.attention import cache_kwarg
from nexus.layer_buffers import grown_capacity
from nexus.memory import KVMemory
from tests.nexus.unlabelled import evicting
from tests.tiny_models import tiny_qwen3

SMALL = dict(density=0.25, window=8, block_size=8)
PROMPT = 200


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(torch.float32, layers=3)


def _entry_bytes(model) -> int:
    """(D_k + D_v) x element size: the bytes of one (layer, row, KV head, position) K+V pair."""
    return 2 * model.config.head_dim * 4


def _valid_entries(cache) -> list[int]:
    return [int((cache.retained_positions(i) >= 0).sum()) for i in range(cache.num_layers)]


def _buffer_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for lay in cache.layers for t in (lay._k, lay._v))


def _feed(model, cache, ids):
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})


@pytest.mark.parametrize("method", nexus.METHODS)
def test_held_counts_valid_entries_and_allocated_the_buffers(model, method):
    cfg = nexus.EvictionConfig(method=method, scope="prefill_decode", **SMALL, **evicting(method))
    cache = nexus.EvictableCache(model.config, cfg)
    assert cache.memory() == KVMemory(0, 0, 0, 0)
    ids = torch.randint(0, 1000, (1, PROMPT + 24), generator=torch.Generator().manual_seed(1))
    _feed(model, cache, ids[:, :PROMPT])
    for i in range(PROMPT, PROMPT + 24):
        _feed(model, cache, ids[:, i : i + 1])
        held, allocated = cache.held_bytes(), cache.allocated_bytes()
        assert held == sum(_valid_entries(cache)) * _entry_bytes(model)
        assert held == sum(lay.held_bytes() for lay in cache.layers)
        assert allocated == _buffer_bytes(cache) == sum(lay.allocated_bytes() for lay in cache.layers)
        assert allocated >= held
        assert cache.memory() == KVMemory(held, allocated, cache.meter.peak_held, cache.meter.peak_allocated)
    if method == "dense":
        assert allocated > held  # grown in chunks: spare slots are allocated, not held
    if method.startswith("ada_"):
        assert any(lay.ragged for lay in cache.layers), "the ragged case must be exercised"
        assert held < allocated  # the -1 padding of short heads is allocated, never held


@pytest.mark.parametrize("method", nexus.METHODS)
def test_a_prefills_peak_is_each_layer_full_while_the_earlier_ones_have_evicted(model, method):
    """The peak of one prefill from an empty cache, recomputed from its eviction event in layer order: after
    layer i appends it holds `before` slots while layers < i hold what they kept and layers > i hold nothing."""
    cfg = nexus.EvictionConfig(method=method, scope="prefill_only", **SMALL, **evicting(method))
    cache = nexus.EvictableCache(model.config, cfg)
    _feed(model, cache, torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(2)))
    per_layer = cache.events[-1].per_layer if cache.events else {}
    heads, entry = model.config.num_key_value_heads, _entry_bytes(model)
    kept = _valid_entries(cache)  # one event: what each layer holds now is what it kept then
    held_now, moments = 0, []
    for layer in range(cache.num_layers):
        before, after = per_layer.get(layer, (PROMPT, PROMPT))
        assert before == PROMPT
        if not method.startswith("ada_"):
            assert kept[layer] == heads * after
        moments.append(held_now + heads * before * entry)  # layer full, before its eviction
        held_now += kept[layer] * entry
        moments.append(held_now)
    memory = cache.memory()
    assert memory.kv_peak_held_bytes == max(moments)
    assert memory.kv_held_bytes == held_now
    # allocated: layer i's prefill buffer grew to grown_capacity(PROMPT) slots before it was resized
    grown = heads * grown_capacity(PROMPT) * entry
    sized = [lay.allocated_bytes() for lay in cache.layers]
    assert memory.kv_peak_allocated_bytes == max(sum(sized[:i]) + grown for i in range(cache.num_layers))
    if cfg.evicts:
        assert memory.kv_peak_held_bytes > memory.kv_held_bytes  # the post-eviction snapshot is not the peak
        assert memory.kv_peak_allocated_bytes > memory.kv_allocated_bytes


def test_reset_peaks_starts_a_new_window(model):
    cfg = nexus.EvictionConfig(method="snapkv", scope="prefill_decode", **SMALL)
    cache = nexus.EvictableCache(model.config, cfg)
    ids = torch.randint(0, 1000, (1, PROMPT + 40), generator=torch.Generator().manual_seed(3))
    _feed(model, cache, ids[:, :PROMPT])
    prefill = cache.memory()
    cache.reset_peaks()
    now = cache.memory()
    assert (now.kv_peak_held_bytes, now.kv_peak_allocated_bytes) == (now.kv_held_bytes, now.kv_allocated_bytes)
    peaks = set()
    for i in range(PROMPT, PROMPT + 40):  # crosses a decode event (budget + slack)
        _feed(model, cache, ids[:, i : i + 1])
        m = cache.memory()
        assert m.kv_peak_held_bytes >= m.kv_held_bytes and m.kv_peak_allocated_bytes >= m.kv_allocated_bytes
        peaks.add(m.kv_peak_held_bytes)
    assert any(e.phase == "decode" for e in cache.events)
    assert max(peaks) < prefill.kv_peak_held_bytes  # the prefill's peak belongs to the window before
    assert cache.memory().kv_peak_held_bytes > cache.memory().kv_held_bytes  # the decode event freed slots
    cache.reset()
    assert cache.memory() == KVMemory(0, 0, 0, 0)


def test_ragged_heads_hold_what_a_uniform_method_holds(model):
    """Ada keeps about Hkv x budget entries per layer, like SnapKV; only its allocated bytes carry the padding."""
    ids = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    memory = {}
    for method in ("snapkv", "ada_snapkv"):
        cache = nexus.EvictableCache(model.config, nexus.EvictionConfig(method=method, scope="prefill_only", **SMALL))
        _feed(model, cache, ids)
        memory[method] = cache.memory()
    snap, ada = memory["snapkv"], memory["ada_snapkv"]
    assert snap.kv_held_bytes == snap.kv_allocated_bytes  # prefill_only: sized exactly to what it keeps
    assert ada.kv_held_bytes <= snap.kv_held_bytes * 1.02
    assert ada.kv_allocated_bytes > ada.kv_held_bytes
