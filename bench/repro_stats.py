"""The statistics of docs/reproductions.md without scipy: Student's t quantile from the regularised incomplete
beta function (bisection), a mean's 95% t-interval, and the 95% Welch interval of a difference of means."""

from __future__ import annotations

import math
import statistics


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) by Lentz's continued fraction (Numerical Recipes 6.4)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point
        return 1 - _betainc(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)) * h / a


def t_quantile(p: float, df: float) -> float:
    """The p quantile (p > 0.5) of Student's t with df degrees of freedom (df may be fractional: Welch)."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - 0.5 * _betainc(df / 2, 0.5, df / (df + mid * mid)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_ci(xs: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95% t-interval); None with fewer than 2 values."""
    m = statistics.fmean(xs)
    return m, (t_quantile(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def welch(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """(mean(a) - mean(b), half-width of its 95% Welch interval); None unless both have 2 values or more."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return diff, 0.0
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff, t_quantile(0.975, df) * math.sqrt(va + vb)
