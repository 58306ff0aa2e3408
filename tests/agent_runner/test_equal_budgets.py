"""Equal memory at equal density (issue 31): at one density every eviction method holds the same number of KV
entries per layer, on the real model smollm2-135m (30 layers, 3 KV heads).

One dense prefill of ~2K tokens of real filler text (the probes' corpus), recorded once with
`nexus.shared_prefill.record_prefill` (exact: the cache each method's own prefill would leave, see that
module), then for each method x density (scope prefill_only) the cache built from it. A layer holds
sum over its KV heads of the valid slots; base = `nexus.prefill_budget(cfg, T)` per KV head. Allowed per layer:

- snapkv, h2o, morphkv, streaming_llm, nexus: exactly Hkv x base. (Nexus's `leftover="partial_block"` fills
  the budget exactly; with `leftover="unused"` it held whole blocks only: 91-98% of it at density 0.1 on
  three such prompts, docs/methods.md.)
- pyramidkv: exactly Hkv x its layer budget. The schedule floors its per-layer step (nexus/policies/pyramidkv.py),
  so the mean layer budget is base + ((max - min) mod (L - 1)) / 2: at least base, below base + (L - 1) / 2.
- observation_masking, under its budgeted rule (the one held to the density budget): exactly Hkv x base. Its paper
  rule keeps what the rule leaves, a budget set by content (tests/agent_runner/test_turn_segments_episodes.py holds
  it on this model), so it has no place in a table of equal memory.
- ada_snapkv, ada_pyramidkv, ada_nexus: Ada-KV's allocation (nexus/policies/ada.py, `head_counts`) rounds per
  head: B' = floor((Hkv budget - forced) / Hkv) drops up to Hkv - 1 slots of the layer, floor(B' alpha) less than
  one per head, round() up to 1/2 per head either way. So a layer holds more than Hkv x budget - (5 Hkv / 2 - 1)
  and at most Hkv x budget + Hkv / 2 (the layer budget: the pyramid's for ada_pyramidkv). Each head keeps
  exactly its count (Ada-Nexus too, with partial_block; with "unused" a layer lost up to b - 1 more).
"""

from __future__ import annotations

import random

import pytest
import torch

import nexus
from measure.probes.corpus import excerpt_lines
from nexus.methods import DENSE, METHODS
from nexus.shared_prefill import record_prefill

DENSITIES = (0.1, 0.2, 0.3)
PROMPT_TOKENS = 2048  # asked of the corpus (counted line by line, so the joined text encodes to a little fewer)
# H2O's observe scores every prefill row against every key: chunks of 64 rows instead of its default 512 give the
# same sums (chunking is memory only, see nexus/policies/h2o.py) about twice as fast on one CPU thread
SPEED_ONLY = {"h2o": {"chunk_rows": 64}}
#: the setting a method is held to the density budget with (the paper rule of observation_masking has a content budget)
AT_DENSITY = {"observation_masking": {"rule": "budget"}}


@pytest.fixture(scope="module")
def recorded(smollm2_host):
    tok = smollm2_host.tokenizer
    text = "\n".join(excerpt_lines("reference", tok, PROMPT_TOKENS, random.Random("equal-budgets")))
    ids = tok.encode(text, add_special_tokens=False)[:PROMPT_TOKENS]
    assert 1800 <= len(ids) <= PROMPT_TOKENS, len(ids)
    return record_prefill(smollm2_host.model, torch.tensor([ids]))


def held_per_layer(cache: nexus.EvictableCache) -> list[int]:
    """Entries each layer holds: valid slots summed over KV heads (batch 1)."""
    return [int((cache.retained_positions(i) >= 0).sum()) for i in range(cache.num_layers)]


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in METHODS if m != DENSE])
def test_every_method_holds_its_budget_per_layer(recorded, method):
    hkv = recorded.model_config.num_key_value_heads
    t = recorded.length
    for density in DENSITIES:
        settings = {**SPEED_ONLY.get(method, {}), **AT_DENSITY.get(method, {})}
        cfg = nexus.EvictionConfig(method=method, scope="prefill_only", density=density, **settings)
        cache = recorded.cache_for(cfg)
        base = nexus.prefill_budget(cfg, t)
        budgets = [cache.budget(i) for i in range(cache.num_layers)]
        held = held_per_layer(cache)
        where = f"{method} at density {density} (T={t}, base budget {base} per head, Hkv={hkv})"
        assert base < t and cache.events, f"{where}: the prefill must evict"
        if "pyramidkv" in method:
            levels = len(budgets) - 1
            mean = sum(budgets) / len(budgets)
            assert budgets == sorted(budgets, reverse=True), f"{where}: pyramid budgets {budgets}"
            assert base <= mean < base + levels / 2, (
                f"{where}: mean layer budget {mean}, allowed [{base}, {base + levels / 2})"
            )
        else:
            assert budgets == [base] * len(budgets), f"{where}: layer budgets {budgets}"
        for layer, (n, budget) in enumerate(zip(held, budgets, strict=True)):
            want = hkv * budget
            if method.startswith("ada_"):
                low, high = want - (5 * hkv / 2 - 1), want + hkv / 2
                assert low < n <= high, f"{where}, layer {layer}: holds {n} entries, allowed ({low}, {high}]"
            else:
                assert n == want, f"{where}, layer {layer}: holds {n} entries, {want} = Hkv x budget {budget}"
        mean_held = sum(held) / len(held)
        assert abs(mean_held - hkv * sum(budgets) / len(budgets)) < cfg.block_size, (
            f"{where}: mean held {mean_held} per layer is a block or more off Hkv x the mean layer budget"
        )
