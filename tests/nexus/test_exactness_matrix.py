"""Every method x scope through a real (tiny, random) Qwen3: the invariant and the budget, end to end.

After any eviction the next logits must equal one full forward over the whole stream with the evicted
(layer, KV head, position) entries masked out; and after every event each layer holds at most
budget + slack tokens per head.
"""

from __future__ import annotations

import pytest
import torch

import nexus
from nexus.testing import StreamRecorder, masked_reference_logits
from tests.nexus.unlabelled import evicting

SMALL = dict(density=0.3, window=4, block_size=4)


def _run(model, method, scope, batch=1, seed=1, **extra):
    cfg = nexus.EvictionConfig(method=method, scope=scope, **{**SMALL, **evicting(method), **extra})
    cache = nexus.EvictableCache(model.config, cfg)
    rec = StreamRecorder(model, cache)
    ids = torch.randint(0, 1000, (batch, 170), generator=torch.Generator().manual_seed(seed))
    occupancy = []

    def feed(chunk):
        rec.feed(chunk)
        occupancy.append([(cache.occupancy(i), cache.budget(i)) for i in range(cache.num_layers)])

    feed(ids[:, :64])  # turn 1 prefill
    for i in range(64, 100):  # turn 1 decode
        feed(ids[:, i : i + 1])
    feed(ids[:, 100:140])  # turn 2: observation appended to the same cache
    for i in range(140, 170):
        feed(ids[:, i : i + 1])
    return rec, cfg, occupancy


FAST = {
    ("nexus", "prefill_decode"),
    ("snapkv", "prefill_only"),
    ("ada_snapkv", "prefill_decode"),
    ("dense", "prefill_only"),
}


#: how many of a matrix's other cells a run measures: every cell over runs, a printed seed a run
CELLS_PER_RUN = 3


def _matrix(methods):
    """Every method x scope: the FAST cells always (the default run's), of the rest a seeded sample of
    :data:`CELLS_PER_RUN` per run under the `slow` marker (``--matrix-seed``, ``--matrix-full``)."""
    sampled = (pytest.mark.slow, pytest.mark.matrix(keep=CELLS_PER_RUN))
    return [
        pytest.param(m, s, marks=pytest.mark.matrix(always=True) if (m, s) in FAST else sampled)
        for m in methods
        for s in nexus.SCOPES
    ]


@pytest.mark.parametrize(("method", "scope"), _matrix(nexus.METHODS))
def test_logits_equal_masked_full_attention(model64, method, scope):
    rec, cfg, _ = _run(model64, method, scope, batch=2)
    ours = torch.cat(rec.logits, 1)
    ref = masked_reference_logits(model64, rec)
    torch.testing.assert_close(ours, ref, atol=1e-9, rtol=0)
    cache = rec.cache
    assert cache.logical_length == 170
    if method == "dense":
        assert not cache.events and all(cache.physical_length(i) == 170 for i in range(cache.num_layers))
    else:
        assert cache.events, f"{method}/{scope} never evicted"
        phases = {e.phase for e in cache.events}
        assert phases == ({"prefill", "decode"} if scope == "prefill_decode" else {"prefill"})


@pytest.mark.parametrize(("method", "scope"), _matrix([m for m in nexus.METHODS if m != "dense"]))
def test_budget_after_every_forward(model32, method, scope):
    rec, cfg, occupancy = _run(model32, method, scope)
    for step, layers in enumerate(occupancy):
        for layer, (held, budget) in enumerate(layers):
            prefill = rec.chunks[step].shape[1] > 1
            if prefill or scope == "prefill_decode":
                # after a prefill the layer is at its budget; while decoding under prefill_decode, below budget+slack
                limit = budget if prefill else budget + cfg.slack
                assert held <= limit + 1e-9, (step, layer, held, budget)
    # the budget is density x the logical length at the end of the last prefill (layer schedules aside)
    base = nexus.prefill_budget(cfg, 140)
    if method not in ("pyramidkv", "ada_pyramidkv"):
        assert rec.cache.budget(0) == base


@pytest.mark.slow
@pytest.mark.parametrize(
    "method",
    [pytest.param("nexus", marks=pytest.mark.matrix(always=True))]
    + [pytest.param(m, marks=pytest.mark.matrix(keep=1)) for m in ("snapkv", "h2o", "morphkv", "ada_nexus")],
)
def test_same_seed_same_evictions(model32, method):
    a, _, _ = _run(model32, method, "prefill_decode", seed=5)
    b, _, _ = _run(model32, method, "prefill_decode", seed=5)
    for layer in range(a.cache.num_layers):
        assert torch.equal(a.cache.retained_positions(layer), b.cache.retained_positions(layer))
    torch.testing.assert_close(torch.cat(a.logits, 1), torch.cat(b.logits, 1), atol=0, rtol=0)
