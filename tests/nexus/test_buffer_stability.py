"""A decoding layer under prefill_decode never reallocates its K/V buffers between eviction events.

Before issue 13 a layer's buffer was sized kept + slack after an event while the next event fires at
budget + slack; a method that keeps fewer slots than its budget (Nexus keeps whole blocks, Ada heads keep
ragged counts) overflowed the buffer before the trigger and regrew it by 256+ slots every cycle. Now the
buffer's storage pointer must stay put for the whole decode (uniform methods), and may change only at an
eviction event for ragged (Ada) layers.
"""

from __future__ import annotations

import math

import pytest
import torch

import nexus
from nexus.attention import cache_kwarg
from nexus.methods import DENSE, METHODS
from tests.nexus.unlabelled import evicting
from tests.tiny_models import tiny_qwen3

EVICTING = [m for m in METHODS if m != DENSE]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(torch.float32, layers=2)


def _decode(model, method: str, steps: int = 160, slack_blocks: int = 1):
    # window 8 / block 8 keep Nexus's min_budget (56) under 20% of a 400-token prompt (budget 80)
    cfg = nexus.EvictionConfig(
        method=method,
        scope="prefill_decode",
        density=0.2,
        window=8,
        block_size=8,
        slack_blocks=slack_blocks,
        **evicting(method),
    )
    cache = nexus.EvictableCache(model.config, cfg)
    ids = torch.randint(0, 1000, (1, 400 + steps), generator=torch.Generator().manual_seed(5))
    kw = {cache_kwarg(model): cache}
    trace = []  # per decode step, per layer: (data_ptr, capacity, evicted this step)
    with torch.no_grad():
        model(ids[:, :400], **kw)
        for i in range(400, 400 + steps):
            before = {layer: cache.layers[layer].events for layer in range(cache.num_layers)}
            model(ids[:, i : i + 1], **kw)
            trace.append(
                [(lay._k.data_ptr(), lay._k.shape[2], lay.events > before[n]) for n, lay in enumerate(cache.layers)]
            )
    return cfg, cache, trace


@pytest.mark.parametrize("method", EVICTING)
def test_decode_never_reallocates_between_events(model, method):
    cfg, cache, trace = _decode(model, method)
    decode_events = [e for e in cache.events if e.phase == "decode"]
    assert len(decode_events) >= 3, f"{method}: the decode must cross several events"
    for layer in range(cache.num_layers):
        ptrs = [step[layer][0] for step in trace]
        moved = [i for i in range(1, len(ptrs)) if ptrs[i] != ptrs[i - 1]]
        at_events = all(trace[i][layer][2] for i in moved)
        assert at_events, f"{method} layer {layer}: buffer reallocated at a step without an event: {moved}"
        if not method.startswith("ada_"):
            assert ptrs == [ptrs[0]] * len(ptrs), f"{method} layer {layer}: storage moved at steps {moved}"
            # the buffer is sized exactly for budget + slack: no spare slots beyond the next event
            assert {step[layer][1] for step in trace} == {cache.budget(layer) + cfg.slack}


@pytest.mark.parametrize("method", ["nexus", "ada_nexus", "ada_snapkv"])
def test_memory_stays_at_budget_plus_slack(model, method):
    """The memory behind Table 5: the held bytes stay within budget + slack per head for the whole decode."""
    cfg, cache, _ = _decode(model, method)
    per_slot = 2 * model.config.num_key_value_heads * model.config.head_dim * 4
    for layer in range(cache.num_layers):
        lay, budget = cache.layers[layer], cache.budget(layer)
        assert lay.occupancy <= budget + cfg.slack  # entries held per head: what Table 5 pins
        if method.startswith("ada_"):
            # ragged heads pad to the longest head (Ada gives each head its own count): the buffer holds the longest
            # head plus room for the appends before the next event, reused while within one slack of that
            room = max(math.ceil(budget + cfg.slack - lay.occupancy), 1)
            assert lay._k.shape[2] <= lay.length + room + cfg.slack
        else:
            assert lay._k.shape[2] <= budget + cfg.slack
        assert lay.allocated_bytes() == lay._k.shape[2] * per_slot


@pytest.mark.parametrize("method", ["h2o", "morphkv", "streaming_llm"])
def test_every_step_eviction_reuses_one_buffer(model, method):
    """slack_blocks=0 (the `reference` preset: H2O, MorphKV and StreamingLLM evict at every decode step):
    an event per step, and still one storage of budget + 1 slots (the slot the next append needs)."""
    cfg, cache, trace = _decode(model, method, steps=40, slack_blocks=0)
    assert sum(e.phase == "decode" for e in cache.events) == 40
    for layer in range(cache.num_layers):
        assert len({step[layer][0] for step in trace}) == 1
        assert {step[layer][1] for step in trace} == {cache.budget(layer) + 1}
