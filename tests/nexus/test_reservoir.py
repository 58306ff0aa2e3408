"""Properties of the n-averaged weighted reservoir (paper section 2.3) and of its log-space form.

Monte Carlo checks use fixed seeds and tolerant bounds, so they are deterministic and not flaky.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nexus.policies.reservoir import (
    descending_ranks,
    direct_priorities,
    draw_uniforms,
    reservoir_log_priorities,
    select_top,
)

WEIGHTS = torch.tensor([0.02, 0.05, 0.1, 0.2, 0.4, 0.8], dtype=torch.float64)
K = 3


def inclusion(weights: torch.Tensor, n: int, trials: int, seed: int = 0) -> torch.Tensor:
    """[trials, N] bool selections, one trial per row, from one seeded generator."""
    u = draw_uniforms((trials, len(weights)), n, torch.Generator().manual_seed(seed), "cpu")
    lp = reservoir_log_priorities(weights.expand(trials, -1), u)
    return select_top(lp, torch.ones(trials, len(weights), dtype=torch.bool), K)


def test_every_positive_weight_is_sometimes_kept():
    hits = torch.zeros(len(WEIGHTS), dtype=torch.long)
    for seed in range(300):
        u = draw_uniforms((len(WEIGHTS),), 5, torch.Generator().manual_seed(seed), "cpu")
        keep = select_top(reservoir_log_priorities(WEIGHTS, u), torch.ones(len(WEIGHTS), dtype=torch.bool), K)
        assert int(keep.sum()) == K
        hits += keep.long()
    assert bool((hits > 0).all()), hits.tolist()
    assert bool((hits < 300).all()) or int(hits[-1]) == 300  # only the heaviest may be kept every time


@pytest.mark.parametrize("n", [1, 5])
def test_inclusion_probability_rises_with_weight(n):
    freq = inclusion(WEIGHTS, n, 3000).double().mean(0)
    assert all(float(freq[i + 1]) >= float(freq[i]) - 0.02 for i in range(len(freq) - 1)), freq.tolist()
    assert float(freq[-1]) - float(freq[0]) > 0.5
    assert math.isclose(float(freq.sum()), K)  # exactly K kept per trial


def test_large_n_converges_to_deterministic_top_k():
    top = torch.zeros(len(WEIGHTS), dtype=torch.bool)
    top[WEIGHTS.argsort(descending=True)[:K]] = True
    agree = {n: float((inclusion(WEIGHTS, n, 1000) == top).all(-1).double().mean()) for n in (1, 5, 50, 500)}
    assert agree[1] < agree[5] < agree[50] <= agree[500], agree
    assert agree[1] < 0.7 and agree[500] == 1.0, agree


def test_same_seed_same_selection_different_seeds_differ():
    w = torch.rand(40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cand = torch.ones(40, dtype=torch.bool)

    def pick(seed):
        return select_top(
            reservoir_log_priorities(w, draw_uniforms((40,), 5, torch.Generator().manual_seed(seed), "cpu")), cand, 10
        )

    assert torch.equal(pick(3), pick(3))
    assert sum(not torch.equal(pick(3), pick(s)) for s in range(4, 14)) >= 8


def test_log_space_equals_direct_formula_in_float64():
    g = torch.Generator().manual_seed(2)
    w = torch.rand(200, generator=g, dtype=torch.float64) * 2 + 0.05
    u = draw_uniforms((200,), 5, g, "cpu")
    direct = np.array([np.mean(u[j].numpy() ** (1.0 / w[j].item())) for j in range(200)])  # plain NumPy
    assert (direct > 0).all()
    np.testing.assert_allclose(reservoir_log_priorities(w, u).numpy(), np.log(direct), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(direct_priorities(w, u).numpy(), direct, rtol=1e-12)


def test_float32_direct_underflows_where_log_space_stays_correct():
    g = torch.Generator().manual_seed(3)
    # weights of a few 1e-3 (a long cache spreads the mass thin), uniforms in [0.1, 0.5]: u^(1/w) is in
    # [1e-250, 1e-50], representable in float64 but below float32's smallest subnormal (1.4e-45)
    w = torch.rand(64, generator=g, dtype=torch.float64) * 2e-3 + 4e-3
    u = torch.rand(64, 5, generator=g, dtype=torch.float64) * 0.4 + 0.1
    exact = np.array([np.mean(u[j].numpy() ** (1.0 / w[j].item())) for j in range(64)])
    assert (exact > 0).all()
    f32 = direct_priorities(w.float(), u.float())
    assert bool((f32 == 0).all())  # float32 loses every one: top-K among zeros would be arbitrary
    logs = reservoir_log_priorities(w.float(), u.float())
    assert bool(torch.isfinite(logs).all())
    np.testing.assert_allclose(logs.numpy(), np.log(exact), rtol=1e-5)  # only float32 input rounding
    cand = torch.ones(64, dtype=torch.bool)
    want = set(np.argsort(-exact, kind="stable")[:8].tolist())
    assert set(torch.nonzero(select_top(logs, cand, 8)).flatten().tolist()) == want


def test_zero_weight_candidate_ranks_last_but_above_non_candidates():
    lp = reservoir_log_priorities(
        torch.tensor([0.0, 0.5, 0.0, 0.3], dtype=torch.float64), torch.full((4, 5), 0.5, dtype=torch.float64)
    )
    assert lp[0] == float("-inf") and lp[2] == float("-inf")
    cand = torch.tensor([True, True, False, True])
    assert select_top(lp, cand, 3).tolist() == [True, True, False, True]
    assert select_top(lp, cand, 5).tolist() == [True, True, False, True]  # never a non-candidate


def test_per_row_k_and_ranks():
    lp = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 5.0]])
    assert descending_ranks(lp).tolist() == [[0, 2, 1], [2, 0, 1]]  # ties to the lower index
    keep = select_top(lp, torch.ones(2, 3, dtype=torch.bool), torch.tensor([1, 2]))
    assert keep.tolist() == [[True, False, False], [False, True, True]]


def test_uniforms_are_open_interval_and_follow_the_generator():
    a = draw_uniforms((3, 4), 5, torch.Generator().manual_seed(9), "cpu")
    b = torch.rand((3, 4, 5), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    assert a.shape == (3, 4, 5) and a.dtype == torch.float64 and torch.equal(a, b)
    assert bool(((a > 0) & (a < 1)).all())
    assert torch.equal(draw_uniforms((2,), 3, None, "cpu"), draw_uniforms((2,), 3, None, "cpu"))
