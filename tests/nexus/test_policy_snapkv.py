"""SnapKV against a NumPy loop transcription of the method (GQA G=2, B=2)."""

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


def reference_forced(pos: np.ndarray, n: int) -> set[int]:
    """Slots of the n highest valid logical positions."""
    valid = [(p, s) for s, p in enumerate(pos) if p >= 0]
    return {s for _, s in sorted(valid)[len(valid) - n :]} if n > 0 else set()


def reference_pool(x: np.ndarray, k: int, pooling: str) -> np.ndarray:
    out = np.zeros_like(x)
    for p in range(len(x)):
        lo, hi = max(0, p - k // 2), min(len(x), p + k // 2 + 1)
        out[p] = x[lo:hi].max() if pooling == "max" else x[lo:hi].sum() / k
    return out


def reference_scores(view, kernel: int, pooling: str, per_query_head: bool):
    """{(b, h): (pooled score [P], forced slots)} computed with explicit loops in float64."""
    keys = view.keys.double().numpy()
    queries = view.queries.double().numpy()
    pos = view.positions.numpy()
    qpos = view.query_positions.numpy()
    g_size = view.group_size
    out = {}
    for b in range(keys.shape[0]):
        for h in range(keys.shape[1]):
            forced = reference_forced(pos[b, h], min(view.window, view.budget))
            per_head = []
            for g in range(g_size):
                rows = []
                for i, qp in enumerate(qpos):
                    logits = np.full(len(pos[b, h]), -np.inf)
                    for s, kp in enumerate(pos[b, h]):
                        if 0 <= kp <= qp:
                            logits[s] = queries[b, h * g_size + g, i] @ keys[b, h, s] * view.scaling
                    rows.append(np_softmax(logits))
                score = np.mean(rows, axis=0)
                for s in range(len(score)):
                    if s in forced or pos[b, h, s] < 0:
                        score[s] = 0.0
                per_head.append(score)
            if per_query_head:
                pooled = np.mean([reference_pool(s, kernel, pooling) for s in per_head], axis=0)
            else:
                pooled = reference_pool(np.mean(per_head, axis=0), kernel, pooling)
            out[b, h] = (pooled, forced)
    return out


def check(policy, view, exact_sets: bool) -> None:
    idx = policy.select(view)
    assert_selection_contract(idx, view, policy.forced(view))
    ref = reference_scores(view, policy.kernel_size, policy.pooling, policy.pool_per_query_head)
    got_scores = policy.score(view).double().numpy()
    got = kept_sets(idx)
    for (b, h), (pooled, forced) in ref.items():
        valid = [s for s in range(len(pooled)) if view.positions[b, h, s] >= 0]
        np.testing.assert_allclose(got_scores[b, h, valid], pooled[valid], rtol=1e-5, atol=1e-7)
        free = {s: pooled[s] for s in valid if s not in forced}
        n_free = min(view.budget, len(valid)) - len(forced)
        if exact_sets:
            assert got[b][h] == forced | np_top(free, n_free), (b, h)
        else:  # max pooling spreads one value over neighbours: ties are common, so check "a valid top-k"
            chosen = got[b][h] - forced
            dropped = set(free) - chosen
            assert forced <= got[b][h] and len(chosen) == n_free
            if chosen and dropped:
                assert min(pooled[s] for s in chosen) >= max(pooled[s] for s in dropped) - 1e-7


@pytest.mark.parametrize("pooling,kernel,per_qh", [("avg", 7, False), ("avg", 5, True), ("avg", 1, False)])
def test_matches_numpy_reference_exact_sets(pooling, kernel, per_qh):
    view = make_view(10 + kernel, length=40, window=6, budget=14)
    check(make_policy("snapkv", pooling=pooling, kernel_size=kernel, pool_per_query_head=per_qh), view, True)


@pytest.mark.parametrize("per_qh", [False, True])
def test_matches_numpy_reference_max_pooling(per_qh):
    view = make_view(20, length=40, window=6, budget=14)
    check(make_policy("snapkv", pool_per_query_head=per_qh), view, False)


def test_after_earlier_eviction_with_holes_and_short_window():
    gen = torch.Generator().manual_seed(5)
    positions = gapped_positions(gen, 2, 2, 30, 90, keep_last=6)
    positions[1, 0, 4:20] = -1  # 14 valid slots left in that head: padded row
    view = make_view(21, positions=positions, window=6, rows=4, budget=16)
    check(make_policy("snapkv", pooling="avg", kernel_size=3), view, True)
    idx = make_policy("snapkv").select(view)
    assert (idx[1, 0] == -1).sum() == 2 and (idx[0] >= 0).all() and (idx[1, 1] >= 0).all()


def test_window_is_counted_inside_the_budget():
    view = make_view(22, length=64, window=8, budget=20)
    idx = make_policy("snapkv").select(view)
    assert idx.shape[-1] == 20
    assert (idx[..., -8:] == torch.arange(56, 64)).all()  # the window is the tail of every row


def test_budget_at_least_length_keeps_everything():
    view = make_view(23, length=18, window=6, budget=25)
    idx = make_policy("snapkv").select(view)
    assert idx.tolist() == [[list(range(18))] * 2] * 2


def test_deterministic():
    policy = make_policy("snapkv")
    a, b = policy.select(make_view(24)), policy.select(make_view(24))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "params,field",
    [
        ({"kernel_size": 4}, "kernel_size"),
        ({"kernel_size": 0}, "kernel_size"),
        ({"pooling": "mean"}, "pooling"),
        ({"kernel_size": 7.0}, "kernel_size"),
        ({"pool_per_query_head": 1}, "pool_per_query_head"),
    ],
)
def test_bad_hyperparameters_raise(params, field):
    with pytest.raises(ValueError, match=field):
        make_policy("snapkv", **params)
