"""CacheStack: rows decoded together equal each row decoded alone (fp64 logits, eviction events, kept slots)."""

from __future__ import annotations

import pytest
import torch

import nexus
from tests.nexus.unlabelled import evicting
from tests.tiny_models import tiny_qwen3

SMALL = dict(density=0.25, window=8, block_size=8)
FAST = {("nexus", "prefill_decode"), ("ada_nexus", "prefill_decode"), ("h2o", "prefill_decode")}


#: how many of the matrix's other 17 cells a run measures: every cell over runs, a printed seed a run
CELLS_PER_RUN = 3


def _matrix():
    """Every method x scope: the FAST cells always, of the rest a seeded sample of :data:`CELLS_PER_RUN` per run
    under the `slow` marker (``--matrix-seed``, ``--matrix-full``)."""
    cells = [(m, s) for m in nexus.METHODS for s in nexus.SCOPES]
    sampled = (pytest.mark.slow, pytest.mark.matrix(keep=CELLS_PER_RUN))
    return [pytest.param(*cell, marks=pytest.mark.matrix(always=True) if cell in FAST else sampled) for cell in cells]


def _step(model, cache, ids, **kw):
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{nexus.cache_kwarg(model): cache}, **kw)
    return out.logits[:, -1]


def _events(cache):
    return [(e.phase, e.logical_length, dict(e.per_layer)) for e in cache.events]


def _buffer_bytes(cache):
    return sum(t.numel() * t.element_size() for lay in cache.layers for t in (lay._k, lay._v))


def _alone(model, cfg, prompt, steps):
    cache = nexus.EvictableCache(model.config, cfg)
    logits = [_step(model, cache, prompt)]
    for _ in range(steps):
        logits.append(_step(model, cache, logits[-1].argmax(-1, keepdim=True)))
    return torch.cat(logits), cache


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(torch.float64, layers=3)


@pytest.mark.parametrize(("method", "scope"), _matrix())
@torch.no_grad()
def test_stacked_rows_equal_each_row_alone(model, method, scope):
    cfg = nexus.EvictionConfig(method=method, scope=scope, **SMALL, **evicting(method))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 1000, (1, n), generator=gen) for n in (211, 97, 160, 64)]
    steps = 40
    alone = [_alone(model, cfg, p, steps) for p in prompts]

    caches = [nexus.EvictableCache(model.config, cfg) for _ in prompts]
    logits = [[_step(model, c, p)] for c, p in zip(caches, prompts, strict=True)]
    stack = nexus.CacheStack(caches)
    for _ in range(steps):
        ids = torch.cat([row[-1].argmax(-1, keepdim=True) for row in logits])
        out = _step(model, stack, ids, position_ids=stack.position_ids())
        for r, row in enumerate(logits):
            row.append(out[r : r + 1])
    stack.release()
    for r, (ref, ref_cache) in enumerate(alone):
        torch.testing.assert_close(torch.cat(logits[r]), ref, atol=1e-9, rtol=0)
        assert _events(caches[r]) == _events(ref_cache), f"row {r}"
        for layer in range(ref_cache.num_layers):
            assert torch.equal(caches[r].retained_positions(layer), ref_cache.retained_positions(layer))
        # the same memory figures, peaks included, and released into buffers of the size it would have alone
        assert caches[r].memory() == ref_cache.memory(), f"row {r}"
        assert caches[r].allocated_bytes() == _buffer_bytes(caches[r]) == _buffer_bytes(ref_cache)
    if cfg.evicts:
        assert any(e.phase == "prefill" for e in caches[0].events)
    if cfg.evicts and scope == "prefill_decode":
        assert any(e.phase == "decode" for c in caches for e in c.events)


@torch.no_grad()
def test_a_stacked_row_can_prefill_and_grow_the_stack(model):
    """A new turn's prefill on a row's own cache while it is stacked writes into its row (growing the stack)."""
    cfg = nexus.EvictionConfig(method="snapkv", scope="prefill_decode", **SMALL)
    a, b = nexus.EvictableCache(model.config, cfg), nexus.EvictableCache(model.config, cfg)
    ref = nexus.EvictableCache(model.config, cfg)
    pa, pb, more = torch.randint(0, 1000, (1, 120)), torch.randint(0, 1000, (1, 80)), torch.randint(0, 1000, (1, 300))
    _step(model, a, pa), _step(model, b, pb), _step(model, ref, pb)
    stack = nexus.CacheStack([a, b])
    capacity = stack.layers[0].k.shape[2]
    out_b = _step(model, b, more)  # b's next turn, fed through its own cache while stacked
    out_ref = _step(model, ref, more)
    torch.testing.assert_close(out_b, out_ref, atol=1e-9, rtol=0)
    assert stack.layers[0].k.shape[2] > capacity  # the whole stack grew for b
    assert b.layers[0]._owner is stack.layers[0]
    assert b.memory() == ref.memory()  # its figures are its own, not the stack's
    step = _step(model, stack, torch.tensor([[1], [2]]), position_ids=stack.position_ids())
    torch.testing.assert_close(step[1:], _step(model, ref, torch.tensor([[2]])), atol=1e-9, rtol=0)
    assert _events(b) == _events(ref) and b.memory() == ref.memory()
    assert stack.allocated_bytes() > a.allocated_bytes() + b.allocated_bytes()  # the stack pads a to b's length
    stack.release()
    assert b.allocated_bytes() == _buffer_bytes(b) == _buffer_bytes(ref)


@torch.no_grad()
def test_release_gives_rows_their_own_buffers(model):
    cfg = nexus.EvictionConfig(method="nexus", scope="prefill_decode", **SMALL)
    caches = [nexus.EvictableCache(model.config, cfg) for _ in range(3)]
    for c, n in zip(caches, (90, 150, 60), strict=True):
        _step(model, c, torch.randint(0, 1000, (1, n)))
    held = [c.retained_positions(0) for c in caches]
    stack = nexus.CacheStack(caches)
    assert stack.allocated_bytes() > 0 and all(c.layers[0]._owner is stack.layers[0] for c in caches)
    # a new stack of two rows takes them over; the old stack's release then frees only the row that left
    newer = nexus.CacheStack(caches[:2])
    stack.release()
    assert caches[2].layers[0]._owner is None and caches[0].layers[0]._owner is newer.layers[0]
    assert caches[2].layers[0]._k.shape[0] == 1
    newer.release()
    for c, h in zip(caches, held, strict=True):
        assert c.layers[0]._owner is None and torch.equal(c.retained_positions(0), h)


def test_bad_stacks_are_refused(model):
    cfg = nexus.EvictionConfig(method="snapkv", **SMALL)
    fresh = nexus.EvictableCache(model.config, cfg)
    with pytest.raises(ValueError, match="at least one"):
        nexus.CacheStack([])
    with pytest.raises(ValueError, match="prefilled"):
        nexus.CacheStack([fresh])
    with torch.no_grad():
        _step(model, fresh, torch.randint(0, 1000, (1, 50)))
    with pytest.raises(ValueError, match="only once"):
        nexus.CacheStack([fresh, fresh])
    stack = nexus.CacheStack([fresh])
    with pytest.raises(ValueError, match="needs keys of batch 1"), torch.no_grad():
        _step(model, stack, torch.randint(0, 1000, (2, 3)), position_ids=torch.arange(50, 53).expand(2, -1))


@torch.no_grad()
def test_a_growing_stack_grows_in_chunks(model):
    """Dense rows grow one slot per step: the stack must not reallocate every step once its spare room is used."""
    cfg = nexus.EvictionConfig(method="dense")
    caches = [nexus.EvictableCache(model.config, cfg) for _ in range(2)]
    for c, n in zip(caches, (64, 50), strict=True):
        _step(model, c, torch.randint(0, 1000, (1, n)))
    stack = nexus.CacheStack(caches)
    buffers = set()
    for _ in range(400):
        _step(model, stack, torch.randint(0, 1000, (2, 1)), position_ids=stack.position_ids())
        buffers.add(stack.layers[0].k.data_ptr())
    assert caches[0].layers[0].length == 464 and len(buffers) <= 3


def _alone_turns(model, cfg, prompt, turns):
    """A cache fed `prompt`, then per turn (append, decoded): the append as a prefill and the decoded tokens as
    teacher-forced decode steps one at a time. Returns the logits of every fed position after the prompt."""
    cache = nexus.EvictableCache(model.config, cfg)
    out = [_step(model, cache, prompt)]
    for append, decoded in turns:
        full = model(input_ids=append, use_cache=True, **{nexus.cache_kwarg(model): cache}).logits
        out.append(full[:, -1])
        for t in range(decoded.shape[1]):
            out.append(_step(model, cache, decoded[:, t : t + 1]))
    return torch.cat(out), cache


@pytest.mark.parametrize(("method", "scope"), _matrix())
@torch.no_grad()
def test_stacked_multi_token_feeds_equal_each_row_alone(model, method, scope):
    """Rows of one stack fed the same appended turns (a q-token prefill each) and teacher-forced tokens (chunks up
    to the first row's next decode event) equal each row fed alone, token by token: logits, events, kept slots and
    memory figures. The rows differ in density, so they evict at different moments."""
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 1000, (1, 150), generator=gen)
    turns = [(torch.randint(0, 1000, (1, n), generator=gen), torch.randint(0, 1000, (1, 37), generator=gen))
             for n in (61, 23)]  # fmt: skip
    cfgs = [
        nexus.EvictionConfig(method=method, scope=scope, **{**SMALL, **evicting(method), "density": d})
        for d in (0.25, 0.4, 0.6)
    ]
    alone = [_alone_turns(model, cfg, prompt, turns) for cfg in cfgs]

    caches = [nexus.EvictableCache(model.config, cfg) for cfg in cfgs]
    logits = [[_step(model, c, prompt)] for c in caches]
    stack = nexus.CacheStack(caches)
    for append, decoded in turns:
        ids = append.expand(len(caches), -1)
        full = model(input_ids=ids, position_ids=stack.position_ids(q=ids.shape[1]), use_cache=True,
                     **{nexus.cache_kwarg(model): stack}).logits  # fmt: skip
        for r, row in enumerate(logits):
            row.append(full[r : r + 1, -1])
        pos, chunks = 0, 0
        with stack.decoding():
            while pos < decoded.shape[1]:
                n = stack.decode_chunk(decoded.shape[1] - pos)
                ids = decoded[:, pos : pos + n].expand(len(caches), -1)
                full = model(input_ids=ids, position_ids=stack.position_ids(q=n), use_cache=True,
                             **{nexus.cache_kwarg(model): stack}).logits  # fmt: skip
                for r, row in enumerate(logits):
                    row.append(full[r])
                pos, chunks = pos + n, chunks + 1
        assert chunks < decoded.shape[1]  # fed in chunks, not token by token
    stack.release()
    for r, (ref, ref_cache) in enumerate(alone):
        torch.testing.assert_close(torch.cat(logits[r]), ref, atol=1e-9, rtol=0)
        assert _events(caches[r]) == _events(ref_cache), f"row {r}"
        for layer in range(ref_cache.num_layers):
            assert torch.equal(caches[r].retained_positions(layer), ref_cache.retained_positions(layer))
        assert caches[r].memory() == ref_cache.memory(), f"row {r}"
        assert caches[r].allocated_bytes() == _buffer_bytes(caches[r]) == _buffer_bytes(ref_cache)
    if cfgs[0].evicts:
        assert any(e.phase == "prefill" and e.logical_length > 150 for e in caches[0].events)  # a stacked prefill
    if cfgs[0].evicts and scope == "prefill_decode":
        assert any(e.phase == "decode" for c in caches for e in c.events)
