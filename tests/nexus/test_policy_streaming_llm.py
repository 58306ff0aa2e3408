"""StreamingLLM: sinks + recency, checked against a plain-Python reference on positions."""

from __future__ import annotations

import pytest
import torch

from nexus.policies import make_policy
from nexus.policies.base import oldest_slots
from tests.nexus.baseline_helpers import (
    assert_selection_contract,
    gapped_positions,
    kept_sets,
    make_view,
)


def reference_kept(positions: list[int], budget: int, n_sink: int) -> set[int]:
    """Slots kept: the n_sink lowest valid positions, then the highest positions up to the budget."""
    valid = sorted((pos, slot) for slot, pos in enumerate(positions) if pos >= 0)
    sinks = valid[: min(n_sink, budget)]
    rest = [v for v in valid if v not in sinks]
    recent = rest[len(rest) - max(budget - len(sinks), 0) :] if budget > len(sinks) else []
    return {slot for _, slot in sinks + recent}


def check_against_reference(policy, view) -> None:
    idx = policy.select(view)
    assert_selection_contract(idx, view, oldest_slots(view.positions, min(policy.n_sink, view.budget)))
    got = kept_sets(idx)
    for b, head_rows in enumerate(view.positions.tolist()):
        for h, row in enumerate(head_rows):
            assert got[b][h] == reference_kept(row, view.budget, policy.n_sink), (b, h)


def test_fresh_cache_keeps_sinks_and_recent():
    view = make_view(0, length=40, budget=12)
    idx = make_policy("streaming_llm").select(view)
    expected = list(range(4)) + list(range(32, 40))
    assert idx.tolist() == [[expected] * 2] * 2


@pytest.mark.parametrize("n_sink,budget", [(4, 12), (0, 9), (2, 30), (4, 5)])
def test_after_earlier_eviction_matches_reference(n_sink, budget):
    gen = torch.Generator().manual_seed(n_sink * 100 + budget)
    positions = gapped_positions(gen, 2, 3, 36, 200, keep_last=6)
    view = make_view(1, kv_heads=3, positions=positions, budget=budget)
    check_against_reference(make_policy("streaming_llm", n_sink=n_sink), view)


def test_empty_slots_and_short_rows_pad_with_minus_one():
    positions = torch.arange(20).expand(2, 2, 20).clone()
    positions[0, 1, 3:17] = -1  # 6 valid slots < budget: this row alone is padded
    positions[1, 0, :2] = -1  # sinks evicted from the physical front: the lowest remaining become sinks
    view = make_view(2, positions=positions, budget=10)
    policy = make_policy("streaming_llm")
    check_against_reference(policy, view)
    idx = policy.select(view)
    assert (idx[0, 1] == -1).sum() == 4
    assert (idx[[0, 1, 1], [0, 0, 1]] >= 0).all()


def test_budget_at_least_length_keeps_everything_valid():
    positions = torch.arange(15).expand(1, 2, 15).clone()
    positions[0, 0, 5] = -1
    view = make_view(3, batch=1, positions=positions, budget=15)
    idx = make_policy("streaming_llm").select(view)
    assert idx[0, 0].tolist() == [i for i in range(15) if i != 5] + [-1]
    assert idx[0, 1].tolist() == list(range(15))


def test_no_queries_needed_and_min_budget():
    policy = make_policy("streaming_llm")
    assert policy.needs_queries is False and policy.observes is False
    assert policy.min_budget(16, 32) == 5
    assert make_policy("streaming_llm", n_sink=0).min_budget(16, 32) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_bad_n_sink_raises(bad):
    with pytest.raises(ValueError, match="n_sink"):
        make_policy("streaming_llm", n_sink=bad)


def test_unknown_parameter_raises():
    with pytest.raises(ValueError, match="n_sink"):
        make_policy("streaming_llm", sinks=4)
