"""MorphKV against a NumPy loop transcription: group-summed logits, per-row softmax over old slots, fusion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nexus.policies import make_policy
from tests.nexus.baseline_helpers import (
    assert_selection_contract,
    gapped_positions,
    kept_sets,
    make_view,
    np_softmax,
    np_top,
)


def reference(view, fusion: str):
    """{(b, h): (fused score over old slots {slot: value}, forced slots)} in float64 loops."""
    keys = view.keys.double().numpy()
    queries = view.queries.double().numpy()
    pos = view.positions.numpy()
    qpos = view.query_positions.tolist()
    g_size = view.group_size
    out = {}
    for b in range(keys.shape[0]):
        for h in range(keys.shape[1]):
            valid = sorted((p, s) for s, p in enumerate(pos[b, h]) if p >= 0)
            n_forced = min(view.window + 1, view.budget)
            forced = {s for _, s in valid[len(valid) - n_forced :]}
            old = [s for _, s in valid if s not in forced]
            rows = []
            for i, qp in enumerate(qpos):
                logits = np.array(
                    [
                        sum(queries[b, h * g_size + g, i] @ keys[b, h, s] for g in range(g_size)) * view.scaling
                        if pos[b, h, s] <= qp
                        else -np.inf
                        for s in old
                    ]
                )
                rows.append(np_softmax(logits))
            fused = np.max(rows, axis=0) if fusion == "max" else np.sum(rows, axis=0)
            out[b, h] = (dict(zip(old, fused, strict=True)), forced)
    return out


def check(policy, view) -> None:
    idx = policy.select(view)
    assert_selection_contract(idx, view, policy.forced(view))
    got, scores = kept_sets(idx), policy.score(view).double().numpy()
    for (b, h), (fused, forced) in reference(view, policy.fusion).items():
        for s, value in fused.items():
            assert scores[b, h, s] == pytest.approx(value, rel=1e-5, abs=1e-7)
        n_valid = len(fused) + len(forced)
        assert got[b][h] == forced | np_top(fused, min(view.budget, n_valid) - len(forced)), (b, h)


@pytest.mark.parametrize("fusion", ["max", "sum"])
def test_matches_numpy_reference(fusion):
    view = make_view(40, length=40, window=5, budget=15)
    check(make_policy("morphkv", fusion=fusion), view)


@pytest.mark.parametrize("fusion", ["max", "sum"])
def test_after_earlier_eviction_short_window_and_holes(fusion):
    gen = torch.Generator().manual_seed(41)
    positions = gapped_positions(gen, 2, 2, 28, 120, keep_last=6)
    positions[0, 1, 2:16] = -1  # 14 valid < budget: padded
    view = make_view(42, positions=positions, window=5, rows=3, budget=17)
    check(make_policy("morphkv", fusion=fusion), view)
    assert (make_policy("morphkv").select(view)[0, 1] == -1).sum() == 3


def test_softmax_is_renormalised_over_old_slots_only():
    view = make_view(43, length=30, window=4, budget=10)
    score = make_policy("morphkv", fusion="sum").score(view)
    forced = make_policy("morphkv").forced(view)
    assert forced.sum(-1).eq(5).all() and score.masked_select(forced).eq(0).all()
    # each of the w rows is a distribution over the old slots, so the sum fusion totals w per head
    torch.testing.assert_close(score.sum(-1), torch.full((2, 2), 4.0))


def test_last_window_plus_one_forced_and_budget_respected():
    view = make_view(44, length=50, window=6, budget=20)
    idx = make_policy("morphkv").select(view)
    assert idx.shape[-1] == 20 and (idx[..., -7:] == torch.arange(43, 50)).all()


def test_budget_at_least_length_keeps_everything():
    view = make_view(45, length=12, window=4, budget=12)
    assert make_policy("morphkv").select(view).tolist() == [[list(range(12))] * 2] * 2


def test_min_budget_and_determinism():
    policy = make_policy("morphkv")
    assert policy.min_budget(16, 32) == 18 and policy.needs_queries is True
    assert torch.equal(policy.select(make_view(46)), policy.select(make_view(46)))


def test_bad_fusion_raises():
    with pytest.raises(ValueError, match="fusion"):
        make_policy("morphkv", fusion="mean")
