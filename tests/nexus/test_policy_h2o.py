"""H2O: accumulated attention over several observe() calls with evictions in between, against NumPy.

`LayerCacheDouble` is a test double of the cache's per-layer bookkeeping (append, view, gather of K /
positions / state["slots"] at an eviction), so the policy is driven the way `EvictableCache` drives it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nexus.policies import make_policy
from nexus.policies.base import LayerView
from tests.nexus.baseline_helpers import assert_selection_contract, np_softmax, np_top

B, HKV, G, D = 2, 2, 2, 8


class LayerCacheDouble:
    """Test double: one layer's slots, as the cache keeps them (append last, gather kept slots)."""

    def __init__(self) -> None:
        self.keys = torch.zeros(B, HKV, 0, D)
        self.positions = torch.zeros(B, HKV, 0, dtype=torch.int64)
        self.state: dict = {}
        self.length = 0

    def append(self, new_keys: torch.Tensor) -> torch.Tensor:
        q = new_keys.shape[2]
        new_pos = torch.arange(self.length, self.length + q)
        self.keys = torch.cat([self.keys, new_keys], dim=2)
        self.positions = torch.cat([self.positions, new_pos.expand(B, HKV, q)], dim=2)
        self.length += q
        return new_pos

    def view(self, budget: int) -> LayerView:
        return LayerView(
            layer_idx=0,
            num_layers=1,
            keys=self.keys,
            positions=self.positions,
            queries=torch.zeros(B, HKV * G, 0, D),
            query_positions=torch.zeros(0, dtype=torch.int64),
            scaling=D**-0.5,
            budget=budget,
            window=4,
            block_size=32,
            phase="decode",
            state=self.state,
        )

    def keep(self, idx: torch.Tensor) -> None:
        assert (idx >= 0).all()
        self.keys = self.keys.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, D))
        self.positions = self.positions.gather(2, idx)
        self.state["slots"] = {k: v.gather(2, idx) for k, v in self.state["slots"].items()}


class NumpyH2O:
    """Independent reference: per (b, h) dicts keyed by logical position, float64."""

    def __init__(self, recent_ratio: float, normalize: bool) -> None:
        self.recent_ratio, self.normalize = recent_ratio, normalize
        self.keys = {(b, h): {} for b in range(B) for h in range(HKV)}
        self.acc = {bh: {} for bh in self.keys}
        self.seen = {bh: {} for bh in self.keys}

    def append(self, new_keys: torch.Tensor, positions: torch.Tensor) -> None:
        for (b, h), store in self.keys.items():
            for j, pos in enumerate(positions.tolist()):
                store[pos] = new_keys[b, h, j].double().numpy()
                self.acc[b, h][pos] = 0.0
                self.seen[b, h][pos] = 0.0

    def observe(self, queries: torch.Tensor, positions: torch.Tensor) -> None:
        q = queries.double().numpy()
        for (b, h), store in self.keys.items():
            present = sorted(store)
            for i, qp in enumerate(positions.tolist()):
                visible = [p for p in present if p <= qp]
                for p in visible:
                    self.seen[b, h][p] += 1
                for g in range(G):
                    logits = np.array([q[b, h * G + g, i] @ store[p] * D**-0.5 for p in visible])
                    for p, prob in zip(visible, np_softmax(logits), strict=True):
                        self.acc[b, h][p] += prob

    def score(self, b: int, h: int) -> dict[int, float]:
        if not self.normalize:
            return dict(self.acc[b, h])
        return {p: a / max(self.seen[b, h][p], 1.0) for p, a in self.acc[b, h].items()}

    def evict(self, budget: int) -> dict[tuple[int, int], set[int]]:
        kept = {}
        n_recent = int(self.recent_ratio * budget + 0.5)
        for bh, store in self.keys.items():
            present = sorted(store)
            recent = set(present[len(present) - n_recent :]) if n_recent else set()
            others = {p: s for p, s in self.score(*bh).items() if p not in recent}
            kept[bh] = recent | np_top(others, budget - len(recent))
            for p in present:
                if p not in kept[bh]:
                    del store[p], self.acc[bh][p], self.seen[bh][p]
        return kept


def run_stream(policy, steps, seed: int = 0):
    """Drive policy and reference through `steps` ("feed", n) / ("evict", budget); compare at every step."""
    gen = torch.Generator().manual_seed(seed)
    cache, ref = LayerCacheDouble(), NumpyH2O(policy.recent_ratio, policy.normalize)
    for kind, n in steps:
        if kind == "feed":
            new_keys = torch.randn(B, HKV, n, D, generator=gen)
            queries = torch.randn(B, HKV * G, n, D, generator=gen)
            pos = cache.append(new_keys)
            ref.append(new_keys, pos)
            policy.observe(cache.view(0), queries, pos)
            ref.observe(queries, pos)
        else:
            view = cache.view(n)
            idx = policy.select(view)
            assert_selection_contract(idx, view, policy.forced(view))
            expected = ref.evict(n)
            for (b, h), kept in expected.items():
                assert set(cache.positions[b, h, idx[b, h]].tolist()) == kept, (b, h)
            cache.keep(idx)
        acc = cache.state["slots"]["acc"]
        assert acc.dtype == torch.float32 and acc.shape == cache.positions.shape
        for b in range(B):
            for h in range(HKV):
                want = [ref.acc[b, h][p] for p in cache.positions[b, h].tolist()]
                np.testing.assert_allclose(acc[b, h].double().numpy(), want, rtol=1e-5, atol=1e-6)
    return cache


STREAM = [
    ("feed", 30),
    ("evict", 12),
    ("feed", 1),
    ("feed", 1),
    ("feed", 1),
    ("feed", 7),
    ("evict", 14),
    ("feed", 1),
    ("feed", 1),
    ("evict", 10),
]


@pytest.mark.parametrize("chunking", [{}, {"chunk_rows": 8}, {"chunk_rows": 1}, {"chunk_elements": 700}])
def test_accumulation_and_evictions_match_numpy(chunking):
    run_stream(make_policy("h2o", **chunking), STREAM, seed=len(str(chunking)))


def test_normalized_variant_matches_numpy():
    cache = run_stream(make_policy("h2o", normalize=True, recent_ratio=0.25), STREAM, seed=7)
    assert set(cache.state["slots"]) == {"acc", "seen"}


def test_budget_split_and_min_budget():
    policy = make_policy("h2o")
    assert [policy.recent_count(b, 16) for b in (1, 2, 5, 7, 10)] == [1, 1, 3, 4, 5]  # half up
    assert policy.min_budget(16, 32) == 2
    assert make_policy("h2o", recent_ratio=0.0).min_budget(16, 32) == 1
    assert make_policy("h2o", recent_ratio=0.9).min_budget(16, 32) == 6
    assert policy.needs_queries is False and policy.observes is True


def test_window_recent_rule_forces_only_the_last_w():
    """KVCache-Factory / MorphKV's h2o mode: the last W tokens are recent, the rest of the budget is heavy."""
    policy = make_policy("h2o", recent_rule="window")
    assert [policy.recent_count(b, 4) for b in (5, 20, 100)] == [4, 4, 4]
    assert policy.min_budget(4, 32) == 5
    cache = LayerCacheDouble()
    gen = torch.Generator().manual_seed(4)
    pos = cache.append(torch.randn(B, HKV, 40, D, generator=gen))
    view = cache.view(20)
    policy.observe(view, torch.randn(B, HKV * G, 40, D, generator=gen), pos)
    kept = policy.select(view)
    ratio_kept = make_policy("h2o").select(view)
    for b in range(B):
        for h in range(HKV):
            ids = set(kept[b, h].tolist())
            assert {36, 37, 38, 39} <= ids and len(ids) == 20
            # the ratio rule forces the last 10; the window rule frees 6 of them for heavy hitters
            assert set(range(30, 40)) <= set(ratio_kept[b, h].tolist())
    with pytest.raises(ValueError, match="h2o: recent_rule must be one of ratio, window"):
        make_policy("h2o", recent_rule="last")


def test_budget_at_least_length_keeps_everything():
    policy = make_policy("h2o")
    cache = LayerCacheDouble()
    gen = torch.Generator().manual_seed(3)
    pos = cache.append(torch.randn(B, HKV, 9, D, generator=gen))
    policy.observe(cache.view(0), torch.randn(B, HKV * G, 9, D, generator=gen), pos)
    assert policy.select(cache.view(20)).tolist() == [[list(range(9))] * HKV] * B


def test_mismatched_state_is_a_clear_error():
    cache = LayerCacheDouble()
    cache.append(torch.zeros(B, HKV, 5, D))
    cache.state["slots"] = {"acc": torch.zeros(B, HKV, 9)}
    with pytest.raises(ValueError, match="acc"):
        make_policy("h2o").score(cache.view(3))


@pytest.mark.parametrize(
    "params,field",
    [
        ({"recent_ratio": 1.0}, "recent_ratio"),
        ({"recent_ratio": -0.1}, "recent_ratio"),
        ({"recent_ratio": "0.5"}, "recent_ratio"),
        ({"normalize": 1}, "normalize"),
        ({"chunk_rows": 0}, "chunk_rows"),
        ({"chunk_elements": 0}, "chunk_elements"),
    ],
)
def test_bad_hyperparameters_raise(params, field):
    with pytest.raises(ValueError, match=field):
        make_policy("h2o", **params)
