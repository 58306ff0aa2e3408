"""Nexus's `weight_scale`: what the reservoir's n does at the raw weight scale (nothing) and rescaled (it matters).

Nexus weights sum to about 1 + lam = 1.5, so each is ~1.5 / N. With n * w << 1 the n-averaged priority
(1/n) sum_i u_i^(1/w) is dominated by its largest term and ranks like one Efraimidis-Spirakis draw; divided by
the mean candidate weight ("mean") the weights are O(1) and n moves the selection from sampling (n = 1) towards
the deterministic top-K. Fixed seeds, tolerant bounds (the numbers are in docs/methods.md and come from
bench/reservoir_inclusion.py).
"""

from __future__ import annotations

import pytest
import torch

import nexus
from nexus.attention import cache_kwarg
from nexus.policies.base import ParamError
from nexus.policies.nexus import Nexus, rescale_weights
from nexus.policies.reservoir import draw_uniforms, reservoir_log_priorities, select_top
from tests.tiny_models import tiny_qwen3

PAIR_RAW = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64) * 1.5 / 256  # a 2:1 pair at Nexus's scale, N = 256
TRIALS = 20000


def kept(weights: torch.Tensor, uniforms: torch.Tensor, k: int, scale: str) -> torch.Tensor:
    """[trials, N] bool: the reservoir's top-k with every block a candidate, weights rescaled per `scale`."""
    candidates = torch.ones(uniforms.shape[:-1], dtype=torch.bool)
    w = rescale_weights(weights.expand(candidates.shape), candidates, scale)
    return select_top(reservoir_log_priorities(w, uniforms), candidates, k)


def pair_win_rate(n: int, scale: str, seed: int = 0) -> float:
    """P(the heavier of the 2:1 pair is kept), K = 1, over TRIALS draws."""
    u = draw_uniforms((TRIALS, 2), n, torch.Generator().manual_seed(seed), "cpu")
    return float(kept(PAIR_RAW, u, 1, "raw" if scale == "raw" else "mean")[:, 0].double().mean())


def skewed_row(blocks: int = 256, seed: int = 0) -> torch.Tensor:
    """A Nexus-like row: lognormal(0, 1.5) weights normalised to sum 1.5."""
    w = torch.exp(1.5 * torch.randn(blocks, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return w * (1.5 / w.sum())


def test_raw_scale_n_does_nothing_to_a_2_to_1_pair():
    p1, p50 = pair_win_rate(1, "raw", seed=1), pair_win_rate(50, "raw", seed=2)
    assert abs(p1 - p50) < 0.02
    for p in (p1, p50):
        assert abs(p - 2 / 3) < 0.02


def test_mean_scale_n_moves_a_2_to_1_pair_towards_top_k():
    rates = [pair_win_rate(n, "mean", seed=10 + n) for n in (1, 2, 5, 10, 50)]
    assert abs(rates[0] - 2 / 3) < 0.02  # n = 1 is the plain weighted sample either way
    assert all(b > a + 0.02 for a, b in zip(rates, rates[1:], strict=False)), rates
    assert rates[-1] > 0.95


def test_n1_selects_the_same_under_raw_and_mean():
    """Rescaling by a per-row constant is monotone in u^(1/w), so with one draw the ranking cannot change."""
    weights = skewed_row()
    u = draw_uniforms((500, 256), 1, torch.Generator().manual_seed(3), "cpu")
    assert torch.equal(kept(weights, u, 51, "raw"), kept(weights, u, 51, "mean"))
    u = draw_uniforms((TRIALS, 2), 1, torch.Generator().manual_seed(4), "cpu")
    assert torch.equal(kept(PAIR_RAW, u, 1, "raw"), kept(PAIR_RAW, u, 1, "mean"))


def test_mean_scale_tracks_top_k_much_closer_at_large_n():
    weights, k = skewed_row(), 51
    top = torch.zeros(256, dtype=torch.bool)
    top[weights.argsort(descending=True)[:k]] = True
    u = draw_uniforms((200, 256), 200, torch.Generator().manual_seed(5), "cpu")
    overlap = {s: float((kept(weights, u, k, s) & top).sum(-1).double().mean()) / k for s in ("raw", "mean")}
    assert overlap["mean"] > 0.9
    assert overlap["mean"] > overlap["raw"] + 0.1, overlap


@pytest.mark.parametrize("value", ["max", "", None, 1])
def test_bad_weight_scale_names_the_field(value):
    with pytest.raises(ValueError, match="weight_scale") as err:
        Nexus(weight_scale=value)
    assert isinstance(err.value, ParamError) and err.value.field == "weight_scale"
    with pytest.raises(ValueError, match="weight_scale"):
        nexus.EvictionConfig(method="nexus", weight_scale=value)


def _kept_sets(model, weight_scale: str, reservoir_n: int) -> list[torch.Tensor]:
    """Prefill 200 tokens, decode 8, through a nexus cache; the retained positions of every layer."""
    cfg = nexus.EvictionConfig(
        method="nexus",
        scope="prefill_decode",
        density=0.3,
        window=4,
        block_size=4,
        weight_scale=weight_scale,
        reservoir_n=reservoir_n,
    )
    cache = nexus.EvictableCache(model.config, cfg)
    ids = torch.randint(0, 1000, (1, 208), generator=torch.Generator().manual_seed(7))
    key = cache_kwarg(model)
    with torch.no_grad():
        logits = model(ids[:, :200], **{key: cache}).logits
        for i in range(200, 208):
            logits = model(ids[:, i : i + 1], **{key: cache}).logits
    assert torch.isfinite(logits).all()
    assert [e.phase for e in cache.events][:1] == ["prefill"] and len(cache.events) > 1  # + decode events
    sets = [cache.retained_positions(layer) for layer in range(model.config.num_hidden_layers)]
    for layer, pos in enumerate(sets):
        assert int((pos[0, 0] >= 0).sum()) <= cache.budget(layer) + cfg.slack
    return sets


def test_cache_runs_with_mean_scale_and_keeps_a_different_set():
    model = tiny_qwen3(torch.float32)
    raw, mean = _kept_sets(model, "raw", 50), _kept_sets(model, "mean", 50)
    assert any(not torch.equal(a, b) for a, b in zip(raw, mean, strict=True))
    # with n = 1 the rescaling cannot change the ranking, so the whole stream keeps the same sets
    raw1, mean1 = _kept_sets(model, "raw", 1), _kept_sets(model, "mean", 1)
    assert all(torch.equal(a, b) for a, b in zip(raw1, mean1, strict=True))
