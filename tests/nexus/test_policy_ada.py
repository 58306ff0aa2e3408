"""Ada-KV head-adaptive allocation: the counts against an independent NumPy transcription of the formula,
the ragged output contract, delegation to the inner policy, and the three registered names."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nexus.policies import make_policy
from nexus.policies.ada import AdaKV, head_counts
from nexus.policies.base import LayerView, Policy, ScorePolicy, recent_slots

B, HQ, HKV, D, W = 2, 8, 4, 8, 6


class TableScores(ScorePolicy):
    """Test double: a ScorePolicy whose score is a fixed table (seeded random), so the allocation can be
    checked on arbitrary score shapes. Forced = the last W valid slots (the base default). It records the
    counts Ada hands to `select_counts` and the views it observes."""

    name = "table"
    observes = True
    needs_queries = False

    def __init__(self, scores: torch.Tensor):
        self.table = scores
        self.seen_counts: list[torch.Tensor] = []
        self.observed = 0

    def score(self, view: LayerView) -> torch.Tensor:
        return self.table

    def select_counts(self, view: LayerView, counts: torch.Tensor) -> torch.Tensor:
        self.seen_counts.append(counts)
        return super().select_counts(view, counts)

    def min_budget(self, window: int, block_size: int) -> int:
        return 42

    def layer_budget(self, budget, layer_idx, num_layers, length, window):
        return budget + layer_idx

    def observe(self, view, new_queries, new_positions) -> None:
        self.observed += 1


def make_view(seed: int, slots: int = 60, budget: int = 20, empty: int = 0) -> LayerView:
    """Random K/Q; each head holds `slots` minus up to `empty` trailing empty slots (ragged heads)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(slots).expand(B, HKV, slots).clone()
    if empty:
        for bi in range(B):
            for hi in range(HKV):
                n = int(torch.randint(0, empty + 1, (1,), generator=g))
                if n:
                    pos[bi, hi, slots - n :] = -1
    return LayerView(
        layer_idx=1,
        num_layers=3,
        keys=torch.randn(B, HKV, slots, D, generator=g),
        positions=pos,
        queries=torch.randn(B, HQ, W, D, generator=g),
        query_positions=torch.arange(slots - W, slots),
        scaling=D**-0.5,
        budget=budget,
        window=W,
        block_size=32,
        phase="prefill",
        generator=torch.Generator().manual_seed(seed),
    )


def np_counts(
    scores: np.ndarray, forced: np.ndarray, valid: np.ndarray, budget: int, alpha: float, normalize: bool = False
) -> np.ndarray:
    """Ada-KV allocation written out per batch row with plain NumPy (``normalize``: AdaKV's per-head
    ratio, the mass of a head's top B' candidate scores over the mass of all its candidate scores)."""
    b, h, _ = scores.shape
    out = np.zeros((b, h), dtype=np.int64)
    for bi in range(b):
        f = forced[bi] & valid[bi]
        b_prime = max(h * budget - int(f.sum()), 0) // h
        ratio = np.ones(h)
        if normalize:
            for hi in range(h):
                mine = sorted(
                    (float(scores[bi, hi, p]) for p in range(scores.shape[2]) if valid[bi, hi, p] and not f[hi, p]),
                    reverse=True,
                )
                ratio[hi] = sum(mine[:b_prime]) / sum(mine)
        cands = [
            (scores[bi, hi, p] * ratio[hi], hi)
            for hi in range(h)
            for p in range(scores.shape[2])
            if valid[bi, hi, p] and not f[hi, p]
        ]
        cands.sort(key=lambda t: -t[0])
        winners = np.bincount([hi for _, hi in cands[: h * b_prime]], minlength=h)
        for hi in range(h):
            cap = np.round(winners[hi] * (1 - alpha) + np.floor(b_prime * alpha))
            out[bi, hi] = min(int(cap) + int(f[hi].sum()), int(valid[bi, hi].sum()))
    return out


def heavy_tailed(seed: int, shape) -> torch.Tensor:
    """Scores whose scale differs per head (some heads concentrated, some flat), as in real attention."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(shape[0], shape[1], 1, generator=g) * 4
    return torch.exp(torch.randn(shape, generator=g) * scale)


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("seed", range(4))
def test_counts_match_numpy_formula(seed, alpha):
    view = make_view(seed, budget=15 + 3 * seed, empty=10 * (seed % 2))
    scores = heavy_tailed(seed, (B, HKV, 60))
    forced = recent_slots(view.positions, W)
    counts = head_counts(scores, forced, view.valid, view.budget, alpha)
    want = np_counts(scores.numpy(), forced.numpy(), view.valid.numpy(), view.budget, alpha)
    assert counts.dtype == torch.int64 and counts.tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_normalized_counts_match_numpy_formula(seed):
    view = make_view(seed, budget=15 + 3 * seed, empty=10 * (seed % 2))
    scores = heavy_tailed(seed, (B, HKV, 60))
    forced = recent_slots(view.positions, W)
    counts = head_counts(scores, forced, view.valid, view.budget, 0.2, normalize=True)
    want = np_counts(scores.numpy(), forced.numpy(), view.valid.numpy(), view.budget, 0.2, normalize=True)
    assert counts.tolist() == want.tolist()
    plain = head_counts(scores, forced, view.valid, view.budget, 0.2)
    if seed == 0:  # heavy-tailed heads: normalising really moves the allocation
        assert counts.tolist() != plain.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_total_is_about_hkv_times_budget_and_floor_holds(seed):
    alpha, budget = 0.2, 24
    view = make_view(seed, slots=200, budget=budget)
    forced = recent_slots(view.positions, W)
    counts = head_counts(heavy_tailed(seed, (B, HKV, 200)), forced, view.valid, budget, alpha)
    b_prime = budget - W
    floor = math.floor(b_prime * alpha)
    assert bool((counts >= W + floor).all()), counts.tolist()  # the safeguard floor per head
    assert bool((counts.sum(-1) - HKV * budget).abs().le(HKV // 2 + 1).all()), counts.sum(-1).tolist()
    assert bool((counts != counts[:, :1]).any())  # heavy-tailed heads really get different budgets


def test_alpha_one_is_uniform():
    view = make_view(0, budget=20)
    forced = recent_slots(view.positions, W)
    counts = head_counts(heavy_tailed(0, (B, HKV, 60)), forced, view.valid, 20, 1.0)
    assert counts.tolist() == [[20] * HKV] * B


def test_ragged_selection_is_well_formed():
    view = make_view(3, budget=18, empty=12)
    inner = TableScores(heavy_tailed(3, (B, HKV, 60)))
    idx = AdaKV(inner, 0.2).select(view)
    counts = inner.seen_counts[-1]
    assert idx.shape == (B, HKV, int(counts.max())) and idx.dtype == torch.int64
    forced = recent_slots(view.positions, W)
    for bi in range(B):
        for hi in range(HKV):
            row = idx[bi, hi].tolist()
            real = [i for i in row if i >= 0]
            assert len(real) == int(counts[bi, hi]) and row[len(real) :] == [-1] * (len(row) - len(real))
            assert real == sorted(set(real)) and all(bool(view.valid[bi, hi, i]) for i in real)
            must = set(torch.nonzero(forced[bi, hi]).flatten().tolist())
            assert must <= set(real)
            rest = sorted(
                (p for p in range(60) if view.valid[bi, hi, p] and p not in must),
                key=lambda p: -float(inner.table[bi, hi, p]),
            )
            assert set(real) - must == set(rest[: len(real) - len(must)])  # each head's own best slots


def test_delegates_to_inner():
    inner = TableScores(torch.zeros(1, 1, 1))
    ada = AdaKV(inner)
    assert ada.min_budget(16, 32) == 42 and ada.layer_budget(100, 3, 8, 500, 16) == 103
    assert ada.observes is True and ada.needs_queries is False and ada.evicts and ada.name == "ada_table"
    ada.observe(make_view(0), torch.zeros(1), torch.zeros(1))
    assert inner.observed == 1


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), "0.2", True])
def test_bad_floor_alpha_raises(alpha):
    with pytest.raises(ValueError, match="floor_alpha"):
        AdaKV(TableScores(torch.zeros(1)), alpha)


def test_inner_must_be_a_score_policy():
    with pytest.raises(ValueError, match="ScorePolicy"):
        AdaKV(Policy())


def test_ada_nexus_by_name():
    pol = make_policy("ada_nexus", floor_alpha=0.3, walk_steps=2)
    assert pol.name == "ada_nexus" and pol.floor_alpha == 0.3 and pol.inner.walk_steps == 2
    assert pol.min_budget(16, 32) == pol.inner.min_budget(16, 32)
    with pytest.raises(ValueError, match="walk_steps"):
        make_policy("ada_nexus", walk_steps=-1)
    with pytest.raises(ValueError):
        make_policy("ada_nexus", no_such_knob=1)


def test_ada_nexus_selection_respects_counts():
    g = torch.Generator().manual_seed(4)
    slots, budget = 400, 130
    view = make_view(4, slots=slots, budget=budget)
    view.keys = torch.randn(B, HKV, slots, D, generator=g) * 2
    view.queries = torch.randn(B, HQ, 16, D, generator=g) * 2
    view.query_positions, view.window = torch.arange(slots - 16, slots), 16
    pol = make_policy("ada_nexus")
    counts = pol.counts(view)
    idx = pol.select(view)
    forced = pol.inner.forced(view)
    kept = (idx >= 0).sum(-1)
    assert bool((kept >= forced.sum(-1)).all())
    assert bool((counts.sum(-1) <= HKV * budget).all())
    assert bool((kept.sum(-1) <= counts.sum(-1)).all()) and bool((kept.sum(-1) > counts.sum(-1) - 32).all())
    for bi in range(B):
        for hi in range(HKV):
            real = {i for i in idx[bi, hi].tolist() if i >= 0}
            assert set(torch.nonzero(forced[bi, hi]).flatten().tolist()) <= real


@pytest.mark.parametrize("method", ["ada_snapkv", "ada_pyramidkv"])
def test_ada_baselines_by_name(method):
    pol = make_policy(method, floor_alpha=0.5)
    assert pol.name == method and pol.floor_alpha == 0.5
    base = make_policy(method.removeprefix("ada_"))
    assert pol.min_budget(16, 32) == base.min_budget(16, 32)
    assert pol.layer_budget(200, 0, 4, 1000, 16) == base.layer_budget(200, 0, 4, 1000, 16)
    view = make_view(1, slots=80, budget=24)
    idx = pol.select(view)
    counts = pol.counts(view)
    assert idx.shape[:2] == (B, HKV) and (idx >= 0).sum(-1).tolist() == counts.tolist()
    with pytest.raises(ValueError):
        make_policy(method, no_such_knob=1)
