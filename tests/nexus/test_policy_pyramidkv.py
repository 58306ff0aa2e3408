"""PyramidKV: the per-layer schedule against the formula, and SnapKV's selection under it."""

from __future__ import annotations

import pytest
import torch

from nexus.policies import make_policy
from tests.nexus.baseline_helpers import assert_selection_contract, make_view


def formula_schedule(budget: int, window: int, layers: int, length: int, beta: int = 20) -> list[int]:
    """The reference's per-layer selected counts + the window, transcribed on its own."""
    selected = budget - window
    smallest = selected // beta
    largest = selected * 2 - smallest
    if largest >= length - window:
        largest = length - window
        smallest = selected * 2 - largest
    step = (largest - smallest) // (layers - 1)
    return [largest - layer * step + window for layer in range(layers)]


def schedule(policy, budget, window, layers, length):
    return [policy.layer_budget(budget, layer, layers, length, window) for layer in range(layers)]


@pytest.mark.parametrize(
    "budget,window,layers,length",
    [(2048, 32, 32, 16384), (1024, 32, 32, 1900), (400, 16, 64, 2000), (17, 16, 2, 40), (300, 16, 7, 700)],
)
def test_schedule_follows_the_formula_and_averages_the_uniform_budget(budget, window, layers, length):
    got = schedule(make_policy("pyramidkv"), budget, window, layers, length)
    assert got == formula_schedule(budget, window, layers, length)
    assert got == sorted(got, reverse=True)
    assert min(got) >= window and max(got) <= max(length, budget)
    excess = sum(got) / layers - budget  # the floored step leaves (max - min) mod (L - 1) / 2 on top
    assert 0 <= excess <= (layers - 2) / 2


def test_schedule_hand_computed_values():
    # c = 2016, min = 100, max = 3932, step = 3832 // 31 = 123 (no cap: T - W = 16352)
    got = schedule(make_policy("pyramidkv"), 2048, 32, 32, 16384)
    assert got[0] == 3964 and got[1] == 3841 and got[-1] == 3932 - 31 * 123 + 32 == 151
    # T - W = 1868 <= max 1935: cap; layer 0 keeps everything, min = 1984 - 1868 = 116, step 56
    capped = schedule(make_policy("pyramidkv"), 1024, 32, 32, 1900)
    assert capped[0] == 1900 and capped[-1] == 1868 - 31 * 56 + 32


def test_without_cap_the_schedule_ignores_length():
    policy = make_policy("pyramidkv", cap_to_length=False)
    assert schedule(policy, 1024, 32, 32, 1900) == schedule(policy, 1024, 32, 32, 10**6)
    assert schedule(policy, 1024, 32, 32, 1900) == formula_schedule(1024, 32, 32, 10**6)


@pytest.mark.parametrize(
    "budget,window,layers,length",
    [(512, 32, 1, 4000), (16, 16, 8, 100), (10, 16, 8, 100), (500, 16, 8, 300)],  # L=1, c=0, c<0, T<C
)
def test_degenerate_schedules_fall_back_to_uniform(budget, window, layers, length):
    assert schedule(make_policy("pyramidkv"), budget, window, layers, length) == [budget] * layers


def test_beta_changes_the_slope():
    steep = schedule(make_policy("pyramidkv", beta=2), 1024, 32, 8, 100000)
    flat = schedule(make_policy("pyramidkv"), 1024, 32, 8, 100000)
    # beta=2: c = 992, min = 496, max = 1488, step = 992 // 7 = 141
    assert steep[0] == 1488 + 32 and steep[-1] == 1488 - 7 * 141 + 32
    assert steep[0] - steep[-1] < flat[0] - flat[-1]


def test_selection_is_snapkv_at_the_layer_budget():
    pyramid, snap = make_policy("pyramidkv", pooling="avg"), make_policy("snapkv", pooling="avg")
    view = make_view(30, length=48, window=6, layer_idx=2, num_layers=4)
    view.budget = pyramid.layer_budget(16, view.layer_idx, view.num_layers, 48, view.window)
    idx = pyramid.select(view)
    assert_selection_contract(idx, view, pyramid.forced(view))
    assert torch.equal(idx, snap.select(view))
    assert idx.shape[-1] == view.budget != 16


@pytest.mark.parametrize(
    "params,field",
    [
        ({"beta": 0}, "beta"),
        ({"beta": 2.5}, "beta"),
        ({"cap_to_length": "yes"}, "cap_to_length"),
        ({"pooling": "min"}, "pooling"),
    ],
)
def test_bad_hyperparameters_raise(params, field):
    with pytest.raises(ValueError, match=field):
        make_policy("pyramidkv", **params)
