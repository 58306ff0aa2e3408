"""The statistics ``compare`` reports: Wilson intervals, McNemar's paired test, pass@k, a bootstrap CI.

Pure functions on counts and floats (numpy only for the bootstrap); no scipy. Reference values from
textbook cases are in ``tests/service/test_stats.py``.
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
    values: Sequence[float], *, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of ``values`` (resampled with replacement, seeded so the
    same input always gives the same interval). One value or none gives ``(mean, mean)`` / ``(nan, nan)``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return (math.nan, math.nan)
    if data.size == 1:
        return (float(data[0]), float(data[0]))
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(n_resamples, data.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    # A resampled mean lies within [min, max]; clamping removes summation noise (constant data -> exact).
    return (float(np.clip(low, data.min(), data.max())), float(np.clip(high, data.min(), data.max())))
