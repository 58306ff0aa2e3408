"""The statistics ``compare`` reports: Wilson intervals, McNemar's paired test, pass@k, a bootstrap CI over
clusters, and a sign-flip test over clusters for paired outcomes with several seeds per task.

Pure functions on counts and floats (numpy only for the resampling); no scipy. Reference values from
textbook cases are in ``tests/results/test_stats.py``. What each number means, and which interval and test a
table uses when: ``docs/numbers.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

#: Below this many discordant pairs McNemar's test is exact (binomial); from here on, chi-square with
#: continuity correction (the usual rule of thumb: b + c >= 25).
EXACT_MCNEMAR_BELOW = 25

#: The fewest independent units (tasks; samples for a probe) a percentile bootstrap interval is computed from.
#: Below it the resampled means take too few distinct values (one unit gives one value, two give [min, max]) and
#: the interval is far narrower than the uncertainty; readers print the count and "too few for an interval".
MIN_BOOTSTRAP_UNITS = 10

#: Up to this many units with a non-zero difference, the sign-flip test enumerates every sign vector (2**16);
#: above it, a seeded Monte Carlo of :data:`SIGN_FLIP_RESAMPLES` draws.
EXACT_SIGN_FLIP_UP_TO = 16
SIGN_FLIP_RESAMPLES = 20_000


def z_value(confidence: float) -> float:
    """Two-sided standard-normal quantile: 1.959964 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n``; ``(0.0, 1.0)`` when ``n == 0``.

    center = (p + z²/2n) / (1 + z²/n), half-width = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    z = z_value(confidence)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Clamp the float noise at the ends (successes == 0 or n give exactly 0 or 1 in exact arithmetic).
    return (max(0.0, center - half), min(1.0, center + half))


def binomial_cdf(k: int, n: int, p: float = 0.5) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed exactly in floating point (fine for n up to a few 1000)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)))


def chi2_sf_1df(statistic: float) -> float:
    """Survival function of the chi-square distribution with 1 degree of freedom: erfc(sqrt(x/2))."""
    if statistic < 0:
        raise ValueError(f"a chi-square statistic cannot be negative, got {statistic}")
    return math.erfc(math.sqrt(statistic / 2))


@dataclass(frozen=True)
class McNemarResult:
    """``b``: pairs where only the first arm succeeded; ``c``: only the second. ``statistic`` is the
    continuity-corrected chi-square (``None`` for the exact test)."""

    b: int
    c: int
    p_value: float
    method: str  # "exact" | "chi2_cc"
    statistic: float | None = None

    @property
    def discordant(self) -> int:
        return self.b + self.c


def mcnemar(b: int, c: int, *, exact: bool | None = None) -> McNemarResult:
    """Two-sided McNemar test from the discordant counts. ``exact=None`` picks the exact binomial test
    below :data:`EXACT_MCNEMAR_BELOW` discordant pairs and chi-square with continuity correction above.

    exact: p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2); chi2_cc: (|b - c| - 1)² / (b + c).
    No discordant pairs gives p = 1.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if exact is None:
        exact = n < EXACT_MCNEMAR_BELOW
    if n == 0:
        return McNemarResult(b, c, 1.0, "exact" if exact else "chi2_cc", None if exact else 0.0)
    if exact:
        return McNemarResult(b, c, min(1.0, 2 * binomial_cdf(min(b, c), n)), "exact")
    statistic = max(abs(b - c) - 1, 0) ** 2 / n
    return McNemarResult(b, c, chi2_sf_1df(statistic), "chi2_cc", statistic)


def mcnemar_paired(pairs: Iterable[tuple[bool, bool]], *, exact: bool | None = None) -> McNemarResult:
    """McNemar on paired outcomes ``(first_arm_success, second_arm_success)`` (e.g. method, dense)."""
    b = c = 0
    for first, second in pairs:
        if first and not second:
            b += 1
        elif second and not first:
            c += 1
    return mcnemar(b, c, exact=exact)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) from ``n`` samples of which ``c`` are correct:
    1 - C(n - c, k) / C(n, k), computed as a product to stay stable for large n."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_mean_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    min_units: int = MIN_BOOTSTRAP_UNITS,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval for the mean of ``values`` (one value per independent unit, resampled with
    replacement, seeded so the same input always gives the same interval); ``None`` with fewer than
    ``min_units`` values (:data:`MIN_BOOTSTRAP_UNITS`): too few for an interval."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if min_units < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 units, got min_units={min_units}")
    data = np.asarray(values, dtype=float)
    if data.size < min_units:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(n_resamples, data.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    # A resampled mean lies within [min, max]; clamping removes summation noise (constant data -> exact).
    return (float(np.clip(low, data.min(), data.max())), float(np.clip(high, data.min(), data.max())))


@dataclass(frozen=True)
class SignFlipResult:
    """A paired test over clusters: ``units`` clusters (tasks) with a difference, ``nonzero`` of them not 0,
    ``mean_difference`` the mean over units, ``method`` ``"sign_flip_exact"`` or ``"sign_flip_mc"``."""

    p_value: float
    method: str
    units: int
    nonzero: int
    mean_difference: float


def sign_flip_test(differences: Sequence[float], *, seed: int = 0) -> SignFlipResult:
    """Two-sided paired randomization test of "no difference" from one mean difference per independent unit.

    Under the null hypothesis the two arms are exchangeable within a unit, so each unit's difference is as likely
    negative as positive: p = P(|sum of s_t * d_t| >= |sum of d_t|) over independent random signs s_t. Every sign
    vector is enumerated up to :data:`EXACT_SIGN_FLIP_UP_TO` non-zero units (exact); above, a seeded Monte Carlo
    with the add-one estimate (1 + hits) / (1 + draws), which never reports 0. With one seed per task the
    differences are -1, 0, 1 and the exact test equals the exact McNemar test on the same pairs.
    """
    d = np.asarray(differences, dtype=float)
    if d.size == 0:
        raise ValueError("sign_flip_test needs at least one difference")
    nonzero = d[d != 0]
    mean = float(d.mean())
    observed = abs(float(nonzero.sum()))
    tolerance = 1e-9 * max(1.0, observed)  # differences are means of 0/1: equal sums must compare equal
    m = nonzero.size
    if m == 0:
        return SignFlipResult(1.0, "sign_flip_exact", int(d.size), 0, mean)
    if m <= EXACT_SIGN_FLIP_UP_TO:
        codes = np.arange(2**m, dtype=np.int64)[:, None] >> np.arange(m, dtype=np.int64)
        sums = ((codes & 1) * 2 - 1) @ nonzero
        p = float(np.mean(np.abs(sums) >= observed - tolerance))
        return SignFlipResult(min(1.0, p), "sign_flip_exact", int(d.size), m, mean)
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2, size=(SIGN_FLIP_RESAMPLES, m)) * 2 - 1
    hits = int(np.sum(np.abs(signs @ nonzero) >= observed - tolerance))
    return SignFlipResult((1 + hits) / (1 + SIGN_FLIP_RESAMPLES), "sign_flip_mc", int(d.size), m, mean)
