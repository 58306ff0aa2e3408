"""Retention maps (nexus.retention) of real caches over the tiny Qwen3: dense, evicting, Ada (ragged heads), and
a row of a CacheStack, each against counts taken head by head from `retained_positions`."""

from __future__ import annotations

import json

import pytest
import torch

import nexus
from nexus.retention import check, expand, retention_runs
from tests.tiny_models import tiny_qwen3

SMALL = dict(density=0.25, window=8, block_size=8)
HKV = 2  # tiny_qwen3's KV heads


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(torch.float32, layers=3)


def _step(model, cache, ids, **kw):
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{nexus.cache_kwarg(model): cache}, **kw)
    return out.logits[:, -1]


@torch.no_grad()
def _run(model, method, scope="prefill_decode", prompt=150, steps=30, seed=0):
    """A prefill of `prompt` tokens, then `steps` greedy decode steps (enough for a decode event)."""
    cache = nexus.EvictableCache(model.config, nexus.EvictionConfig(method=method, scope=scope, **SMALL))
    ids = torch.randint(0, 1000, (1, prompt), generator=torch.Generator().manual_seed(seed))
    logits = _step(model, cache, ids)
    for _ in range(steps):
        logits = _step(model, cache, logits.argmax(-1, keepdim=True))
    return cache


def _counts_by_hand(cache) -> list[list[int]]:
    """Per layer, the [L] number of KV heads holding each position, one head and one slot at a time."""
    out = []
    for layer in range(cache.num_layers):
        counts = [0] * cache.logical_length
        for head in cache.retained_positions(layer)[0].tolist():
            held = [p for p in head if p >= 0]
            assert len(held) == len(set(held)), "a head holds a position twice"
            for p in held:
                counts[p] += 1
        out.append(counts)
    return out


def test_dense_is_one_full_run_per_layer(model):
    cache = _run(model, "dense", steps=5)
    runs = retention_runs(cache)
    assert runs == {"logical_length": 155, "kv_heads": HKV, "layers": [[[HKV, 155]]] * 3}
    assert expand(runs) == [[HKV] * 155] * 3
    assert json.loads(json.dumps(runs)) == runs  # stored as JSON as it is


@pytest.mark.parametrize("method", ["snapkv", "nexus", "streaming_llm"])
def test_an_evicting_method_counts_what_each_head_kept(model, method):
    cache = _run(model, method)
    assert any(e.phase == "decode" for e in cache.events) and any(e.phase == "prefill" for e in cache.events)
    runs = retention_runs(cache)
    check(runs)
    counts = expand(runs)
    assert counts == _counts_by_hand(cache)
    for layer, row in enumerate(counts):
        assert 0 in row, f"layer {layer} forgot nothing"
        assert sum(row) == int((cache.retained_positions(layer) >= 0).sum())
        assert row[-1] == HKV  # the newest token is always held (recency window)
    # a run-length encoding: neighbouring runs differ in count
    assert all(a[0] != b[0] for layer in runs["layers"] for a, b in zip(layer, layer[1:], strict=False))


def test_ada_heads_keep_different_positions(model):
    cache = _run(model, "ada_snapkv", prompt=200)
    assert any(cache.layers[i].ragged for i in range(cache.num_layers)), "no ragged layer: the test proves nothing"
    counts = expand(retention_runs(cache))
    assert counts == _counts_by_hand(cache)
    # some position is held by one head and not the other
    assert any(0 < c < HKV for row in counts for c in row)


@torch.no_grad()
def test_a_stacked_row_reads_as_the_same_row_alone(model):
    cfg = nexus.EvictionConfig(method="ada_nexus", scope="prefill_decode", **SMALL)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 1000, (1, n), generator=gen) for n in (180, 90)]
    caches = [nexus.EvictableCache(model.config, cfg) for _ in prompts]
    logits = [_step(model, c, p) for c, p in zip(caches, prompts, strict=True)]
    stack = nexus.CacheStack(caches)
    for _ in range(25):
        ids = torch.cat([row.argmax(-1, keepdim=True) for row in logits])
        out = _step(model, stack, ids, position_ids=stack.position_ids())
        logits = [out[r : r + 1] for r in range(len(caches))]
    stacked = [retention_runs(c) for c in caches]  # the rows are views of the stack, -1 past their length
    for cache, runs in zip(caches, stacked, strict=True):
        assert expand(runs) == _counts_by_hand(cache)
    stack.release()
    assert [retention_runs(c) for c in caches] == stacked
    assert stacked[0]["logical_length"] == 205 and stacked[1]["logical_length"] == 115


def test_an_empty_cache_has_no_positions(model):
    runs = retention_runs(nexus.EvictableCache(model.config, nexus.EvictionConfig(method="snapkv")))
    assert runs == {"logical_length": 0, "kv_heads": 0, "layers": [[], [], []]}
    assert expand(runs) == [[], [], []]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"logical_length": 5, "kv_heads": 2, "layers": [[[2, 4]]]}, "cover 4 positions"),
        ({"logical_length": 5, "kv_heads": 2, "layers": [[[3, 5]]]}, "bad run"),
        ({"logical_length": 5, "kv_heads": 2, "layers": [[[2, 5], [1, 0]]]}, "bad run"),
    ],
)
def test_malformed_runs_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        expand(bad)
