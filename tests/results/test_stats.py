"""Statistics against textbook reference values (no scipy: the numbers are written in)."""

from __future__ import annotations

import math

import pytest

from results.stats import (
    EXACT_MCNEMAR_BELOW,
    MIN_BOOTSTRAP_UNITS,
    binomial_cdf,
    bootstrap_mean_ci,
    chi2_sf_1df,
    mcnemar,
    mcnemar_paired,
    pass_at_k,
    sign_flip_test,
    wilson_interval,
    z_value,
)


def test_z_value():
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert z_value(0.99) == pytest.approx(2.575829, abs=1e-6)


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3
# (Wilson score, no continuity correction), to 4 decimals; 5/10 from Agresti & Coull (1998).
@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (5, 10, 0.2366, 0.7634),
    ],
)
def test_wilson_reference_values(successes, n, low, high):
    lo, hi = wilson_interval(successes, n)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_wilson_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and round(lo, 4) == round(1 - 0.1611, 4)  # mirror of 0/20
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 3)


def test_binomial_cdf():
    assert binomial_cdf(1, 7) == pytest.approx(8 / 128)
    assert binomial_cdf(-1, 5) == 0.0 and binomial_cdf(5, 5) == 1.0


# Exact McNemar: p = 2 * sum_{i<=min(b,c)} C(b+c, i) / 2^(b+c), worked out by hand.
@pytest.mark.parametrize(
    ("b", "c", "p"),
    [(1, 6, 2 * 8 / 128), (0, 5, 2 / 32), (2, 8, 2 * 56 / 1024), (3, 3, 1.0), (0, 0, 1.0), (0, 1, 1.0)],
)
def test_mcnemar_exact(b, c, p):
    result = mcnemar(b, c)
    assert result.method == "exact" and result.p_value == pytest.approx(p) and result.statistic is None


def test_chi2_sf_against_table_quantiles():
    # Upper 5%, 1%, 0.1% points of chi-square(1): 3.841459, 6.634897, 10.827566.
    assert chi2_sf_1df(3.841459) == pytest.approx(0.05, abs=1e-7)
    assert chi2_sf_1df(6.634897) == pytest.approx(0.01, abs=1e-7)
    assert chi2_sf_1df(10.827566) == pytest.approx(0.001, abs=1e-8)
    assert chi2_sf_1df(0.0) == 1.0


def test_mcnemar_chi2_large_counts():
    # Agresti (2002), presidential approval (b=150, c=86): corrected statistic 63^2/236 = 16.82, p ~ 4.1e-5.
    result = mcnemar(150, 86)
    assert result.method == "chi2_cc"
    assert result.statistic == pytest.approx(63**2 / 236)
    assert result.p_value == pytest.approx(4.1146e-5, rel=1e-3)
    # 25 discordant pairs switch to chi-square: (|20 - 5| - 1)^2 / 25 = 7.84.
    at_threshold = mcnemar(20, 5)
    assert EXACT_MCNEMAR_BELOW == 25 and at_threshold.method == "chi2_cc"
    assert at_threshold.statistic == pytest.approx(7.84)
    assert mcnemar(20, 5, exact=True).p_value == pytest.approx(2 * binomial_cdf(5, 25))
    assert mcnemar(12, 12, exact=False).statistic == 0.0


def test_mcnemar_paired_counts_discordant_pairs():
    pairs = [(True, True)] * 4 + [(True, False)] * 1 + [(False, True)] * 6 + [(False, False)] * 9
    result = mcnemar_paired(pairs)
    assert (result.b, result.c, result.discordant) == (1, 6, 7) and result.p_value == pytest.approx(0.125)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),
        (10, 3, 5, 1 - 21 / 252),
        (10, 3, 8, 1.0),
        (5, 0, 3, 0.0),
        (5, 2, 2, 1 - 3 / 10),
        (200, 1, 1, 0.005),
    ],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_is_stable_for_large_n_and_validates():
    assert pass_at_k(10_000, 5_000, 100) == pytest.approx(1.0)
    assert pass_at_k(1000, 10, 10) == pytest.approx(1 - math.comb(990, 10) / math.comb(1000, 10))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)


def test_bootstrap_mean_ci():
    data = [1.0] * 50 + [0.0] * 50
    lo, hi = bootstrap_mean_ci(data, seed=1)
    assert (lo, hi) == bootstrap_mean_ci(data, seed=1)  # seeded: reproducible
    # Normal approximation: 0.5 +- 1.96 * 0.05 = (0.402, 0.598).
    assert lo == pytest.approx(0.402, abs=0.015) and hi == pytest.approx(0.598, abs=0.015)
    assert bootstrap_mean_ci([0.3] * 10) == (0.3, 0.3)
    narrow = bootstrap_mean_ci(data * 4, seed=1)  # 4x the data: about half the width
    assert (narrow[1] - narrow[0]) == pytest.approx((hi - lo) / 2, rel=0.15)


def test_no_bootstrap_interval_from_too_few_units():
    """One unit gave [x, x] and two gave [min, max]: intervals that are not intervals. Below the minimum there is
    none, and the caller says so."""
    assert MIN_BOOTSTRAP_UNITS == 10
    for n in (0, 1, 2, MIN_BOOTSTRAP_UNITS - 1):
        assert bootstrap_mean_ci([1.0 / 3] * n) is None
    assert bootstrap_mean_ci([0.0, 1.0] * 5) is not None  # 10 units
    assert bootstrap_mean_ci([0.2, 0.4], min_units=2) is not None
    with pytest.raises(ValueError, match="at least 2 units"):
        bootstrap_mean_ci([0.5], min_units=1)


@pytest.mark.parametrize(("b", "c", "ties"), [(0, 0, 3), (3, 0, 0), (5, 1, 4), (7, 2, 0), (2, 9, 11), (12, 3, 1)])
def test_sign_flip_on_one_seed_per_task_is_the_exact_mcnemar_test(b, c, ties):
    """With one seed per task the per-task differences are +1 (only the method resolved), -1 (only the baseline)
    and 0: flipping their signs is the exact binomial test on the discordant pairs."""
    differences = [1.0] * b + [-1.0] * c + [0.0] * ties
    result = sign_flip_test(differences)
    assert result.p_value == pytest.approx(mcnemar(b, c, exact=True).p_value, abs=1e-12)
    assert (result.units, result.nonzero, result.method) == (b + c + ties, b + c, "sign_flip_exact")


def test_sign_flip_on_task_means():
    """Several seeds per task: one mean difference per task. Worked by hand: differences 1, 0.5, 0.5 have sum 2;
    of the 8 sign vectors, only all-plus and all-minus reach |sum| >= 2, so p = 2/8."""
    assert sign_flip_test([1.0, 0.5, 0.5]).p_value == pytest.approx(0.25)
    assert sign_flip_test([0.5, -0.5]).p_value == 1.0  # sum 0: every vector reaches it
    assert sign_flip_test([0.0, 0.0]).p_value == 1.0
    big = sign_flip_test([1 / 3] * 30, seed=4)  # 30 units: Monte Carlo, 2 of 2**30 vectors reach 10
    assert big.method == "sign_flip_mc" and big.p_value == pytest.approx(1 / 20_001, rel=0.5)
    assert big.p_value == sign_flip_test([1 / 3] * 30, seed=4).p_value  # seeded
    with pytest.raises(ValueError, match="at least one"):
        sign_flip_test([])
