"""Confidence bounds for the bench's knee: a quantile's, from order statistics, and a rate's (Wilson).

A quantile bound needs no assumption about the latencies' distribution (Conover, *Practical
Nonparametric Statistics*, 3.2): with ``x_(1) <= ... <= x_(n)`` a sample, the number of values
below the true ``q`` quantile is Binomial(n, q), so ``x_(j)`` is at most the quantile with
probability ``P(Binomial(n, q) >= j)`` and ``x_(k)`` at least it with ``P(Binomial(n, q) <= k - 1)``.
A rate's bound is Wilson's score interval (Wilson 1927), which keeps its coverage at rates near 0
and 1, where the normal approximation does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Z_975", "binomial_cdf", "quantile_bounds", "wilson"]

Z_975 = 1.959963984540054
"""The standard normal's 97.5% point: one-sided 97.5% bounds (two-sided 95%)."""


def binomial_cdf(n: int, p: float) -> list[float]:
    """``[P(Binomial(n, p) <= j) for j in 0..n]`` (``0 < p < 1``), computed in log space."""
    log_p, log_q = math.log(p), math.log1p(-p)
    out: list[float] = []
    total = 0.0
    log_choose = 0.0
    for j in range(n + 1):
        if j:
            log_choose += math.log(n - j + 1) - math.log(j)
        total += math.exp(log_choose + j * log_p + (n - j) * log_q)
        out.append(min(1.0, total))
    return out


def quantile_bounds(
    ordered: Sequence[float], q: float, confidence: float = 0.975
) -> tuple[float | None, float | None]:
    """One-sided ``confidence`` bounds on the ``q`` quantile (0..1) of the distribution that
    ``ordered`` (sorted ascending) was drawn from: ``(low, high)`` with ``low <= quantile`` and
    ``high >= quantile`` each with probability at least ``confidence``; None where the sample is too
    small to bound that side."""
    n = len(ordered)
    if n == 0:
        return None, None
    cdf = binomial_cdf(n, q)
    low = None
    for j in range(n, 0, -1):  # the largest j with P(B >= j) = 1 - P(B <= j - 1) >= confidence
        if 1.0 - cdf[j - 1] >= confidence:
            low = ordered[j - 1]
            break
    high = None
    for k in range(1, n + 1):  # the smallest k with P(B <= k - 1) >= confidence
        if cdf[k - 1] >= confidence:
            high = ordered[k - 1]
            break
    return low, high


def wilson(successes: int, n: int, z: float = Z_975) -> tuple[float, float]:
    """Wilson's score interval for a rate of ``successes`` in ``n`` trials: ``(low, high)``, each
    a one-sided bound at the confidence of ``z`` (default 97.5%); ``(0, 1)`` for no trials."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)
