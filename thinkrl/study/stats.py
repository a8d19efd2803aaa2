"""The statistics a method-comparison report needs: small pure functions over lists of floats, standard library only.

Arms run on the same seeds, so arms are compared per seed (a paired t test): seed-to-seed noise that every arm
shares cancels, and a difference far smaller than the spread of any one arm can show. Several arms compared
against one baseline make several tests, so their p-values are Holm-adjusted before any is called significant.
A difference that is not detected is not shown absent: the minimum detectable effect says how large a true
difference these seeds would have caught, and the verdict always states it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

_EPS = 1e-15  # the continued fraction's relative convergence tolerance: near double precision
_TINY = 1e-300  # keeps Lentz's method from dividing by zero
_MAX_TERMS = 20_000  # a guard, far above need: every t_cdf here, df = 1e6 included, converges in under 50 terms


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided t interval at `level`; sd is the sample sd (n - 1). Bounds are nan when n == 1."""

    mean: float
    lower: float
    upper: float
    n: int
    sd: float
    level: float

    def to_dict(self) -> dict:
        return _json_safe(asdict(self))


@dataclass(frozen=True)
class Paired:
    """Arm a minus arm b over the same seeds: the mean difference, its t interval, t statistic, two-sided p."""

    mean_diff: float
    lower: float
    upper: float
    t: float
    p: float
    n: int
    sd: float
    level: float

    def to_dict(self) -> dict:
        return _json_safe(asdict(self))


def _json_safe(d: dict) -> dict:
    # JSON has no nan or infinity; None keeps the file strict JSON, and p and the bounds still say what happened
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _betainc_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method; converges fast for x < (a+1)/(a+b+2)."""
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        # the even term d_2m, then the odd term d_2m+1, of 1 / (1 + d_1 / (1 + d_2 / (1 + ...)))
        for coef in (
            m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0)),
        ):
            d = 1.0 + coef * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + coef / c
            c = c if abs(c) > _TINY else _TINY
            h *= c * d
        if abs(c * d - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta fraction did not converge (a={a}, b={b}, x={x})")


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """Regularized incomplete beta I_x(a, b), with y = 1 - x passed in so callers keep its precision when x ~ 1."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betainc_fraction(a, b, x) / a
    # past the fraction's fast region use I_x(a, b) = 1 - I_y(b, a)
    return 1.0 - math.exp(log_front) * _betainc_fraction(b, a, y) / b


def _t_upper(t: float, df: float) -> float:
    """P(T > t) for t >= 0, computed directly so a small tail keeps its digits (1 - t_cdf would lose them)."""
    if math.isinf(t):
        return 0.0
    # P(|T| > t) = I_x(df/2, 1/2) with x = df / (df + t^2); 1 - x written out so it does not cancel for small t
    x = df / (df + t * t)
    y = t * t / (df + t * t)
    return 0.5 * _betainc(df / 2.0, 0.5, x, y)


def _check_df(df: float) -> None:
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (df may be fractional)."""
    _check_df(df)
    if math.isnan(t):
        return math.nan
    return 1.0 - _t_upper(t, df) if t >= 0 else _t_upper(-t, df)


def t_quantile(p: float, df: float) -> float:
    """The t with t_cdf(t, df) == p, by bisection on the tail; -inf / +inf at p = 0 / 1."""
    _check_df(df)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {p}")
    if p in (0.0, 1.0):
        return math.copysign(math.inf, p - 0.5)
    if p == 0.5:
        return 0.0
    # solve on the smaller tail: it carries full relative precision where 1 - p would not
    tail = min(p, 1.0 - p)
    lo, hi = 0.0, 1.0
    while _t_upper(hi, df) > tail:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_upper(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    t = 0.5 * (lo + hi)
    return t if p > 0.5 else -t


def _check_values(values: list[float], what: str) -> None:
    if not values:
        raise ValueError(f"{what} is empty (length 0): need at least one value")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what} holds non-finite values {bad[:3]}: a failed run should be fixed or dropped, not averaged")


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (n - 1); sd is nan for one value, and exactly 0 when all values are equal."""
    n = len(values)
    if all(v == values[0] for v in values):
        # fsum(values) / n can miss the common value by an ulp and leave a spurious spread
        return float(values[0]), (0.0 if n > 1 else math.nan)
    mean = math.fsum(values) / n
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def mean_interval(values: list[float], level: float = 0.95) -> Interval:
    """The mean of `values` with its two-sided t interval at `level` (n - 1 degrees of freedom).

    With one value the spread cannot be estimated: by convention sd, lower and upper are nan rather than an
    error, so a one-seed study still reports its mean. No values at all raises ValueError."""
    _check_values(values, "values")
    mean, sd = _mean_sd(values)
    n = len(values)
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, math.nan, level)
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd, level)


def paired_difference(a: list[float], b: list[float], level: float = 0.95) -> Paired:
    """Arm a minus arm b, where a[i] and b[i] come from the same seed: mean difference, t interval, paired t test.

    Conventions: with one pair, sd, t, p and the bounds are nan (no spread to test against). When every
    difference is identical (sd == 0) the interval is the point itself; a mean difference of 0 gives t = 0 and
    p = 1.0, any other gives t = +-inf and p = 0.0, the limit of the test as the spread goes to zero."""
    if len(a) != len(b):
        raise ValueError(f"paired arms need one value per seed each: a has length {len(a)}, b has length {len(b)}")
    if not a:
        raise ValueError("paired arms are empty (length 0 and 0): need at least one seed")
    _check_values(a, "a")
    _check_values(b, "b")
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    mean, sd = _mean_sd(diffs)
    if n == 1:
        return Paired(mean, math.nan, math.nan, math.nan, math.nan, 1, math.nan, level)
    if sd == 0.0:
        t = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
        return Paired(mean, mean, mean, t, 1.0 if mean == 0.0 else 0.0, n, 0.0, level)
    se = sd / math.sqrt(n)
    t = mean / se
    half = t_quantile(0.5 + level / 2.0, n - 1) * se
    p = min(1.0, 2.0 * _t_upper(abs(t), n - 1))
    return Paired(mean, mean - half, mean + half, t, p, n, sd, level)


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    Sorted ascending, the j-th smallest (0-based) is multiplied by m - j and capped at 1; a running maximum keeps
    the adjusted values in the same order as the raw ones, so no test is called significant after a smaller p
    that was not. Controls the family-wise error rate with no assumption about how the tests depend. A nan p (a
    test that could not be run, e.g. one seed) stays nan and is not counted in m."""
    bad = [p for p in p_values if not (0.0 <= p <= 1.0 or math.isnan(p))]
    if bad:
        raise ValueError(f"p-values must lie in [0, 1], got {bad[:3]}")
    tested = [k for k, p in enumerate(p_values) if not math.isnan(p)]
    m = len(tested)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for j, i in enumerate(sorted(tested, key=lambda k: p_values[k])):
        running = max(running, min(1.0, (m - j) * p_values[i]))
        adjusted[i] = running
    return adjusted


# Both power functions use the usual normal-shift approximation: under a true mean difference `effect` the paired t
# statistic is treated as a central t shifted by effect * sqrt(n) / sd. Exact power needs the noncentral t distribution;
# by simulation the approximation overstates power by about 3 points at n = 3 and by well under one at n = 12.


def minimum_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean paired difference a two-sided paired t test at `alpha` with n pairs, whose
    differences have this sd, detects with probability `power`: (t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n).
    nan when n < 2 or sd is nan: one pair has no spread to size an effect against."""
    if n < 2 or math.isnan(sd):
        return math.nan
    return (t_quantile(1.0 - alpha / 2.0, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def power_of(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Approximate probability that a two-sided paired t test at `alpha` with n pairs detects a true mean
    difference `effect` when the differences have this sd (both tails counted). nan when n < 2."""
    if n < 2 or math.isnan(sd) or math.isnan(effect):
        return math.nan
    if sd == 0.0:
        # no noise: any real difference is always seen, and none is rejected at the nominal rate
        return 1.0 if effect != 0.0 else alpha
    crit = t_quantile(1.0 - alpha / 2.0, n - 1)
    shift = abs(effect) * math.sqrt(n) / sd
    return 1.0 - t_cdf(crit - shift, n - 1) + t_cdf(-crit - shift, n - 1)


def _num(x: float) -> str:
    return f"{x:.3g}"


def _p(p: float) -> str:
    return "p<0.0001" if p < 1e-4 else f"p={p:.2g}"


def verdict(
    paired: Paired,
    adjusted_p: float,
    mde: float,
    alpha: float = 0.05,
    higher_is_better: bool | None = True,
    a_name: str = "A",
    b_name: str = "B",
    metric: str = "score",
    power: float = 0.8,
    unit: str = "seeds",
) -> str:
    """One sentence that says what was measured and no more: if significant, which arm is higher, by how much
    (interval, adjusted p) and, given `higher_is_better` (None: no better direction), which did better; else no
    difference detected, with the minimum detectable effect at `power` (an undetected difference may be there)."""
    level = f"{paired.level * 100:g}%"
    if paired.n < 2:
        return (
            f"{metric}: {a_name} - {b_name} = {_num(paired.mean_diff)} from {paired.n} seed; "
            "one seed cannot separate a difference from seed noise"
        )
    if adjusted_p <= alpha and paired.mean_diff != 0.0:
        higher = paired.mean_diff > 0
        hi_name, lo_name = (a_name, b_name) if higher else (b_name, a_name)
        # the interval of the gap as stated ("higher by"), i.e. of hi - lo, so its bounds read in the same direction
        lo, hi = (paired.lower, paired.upper) if higher else (-paired.upper, -paired.lower)
        measured = (
            f"{metric}: {hi_name} higher than {lo_name} by {_num(abs(paired.mean_diff))} "
            f"({level} CI {_num(lo)} to {_num(hi)}), Holm-adjusted {_p(adjusted_p)}, over {paired.n} paired {unit}"
        )
        if higher_is_better is None:  # a measurement with no better direction (e.g. a probe's entropy slope)
            return measured
        better = hi_name if higher_is_better else lo_name
        direction = "higher" if higher_is_better else "lower"
        return f"{measured}; {direction} is better, so {better} did better on these {unit}"
    mde_text = (  # an MDE of 0 (no spread) would claim every difference detectable: undefined
        f"these {paired.n} {unit} detect a true difference of {_num(mde)} or more {power * 100:g}% of the time"
        if 0 < mde < math.inf
        else f"the minimum detectable effect is {'undefined: the paired differences have no spread' if mde == 0 else 'unknown'}"
    )
    return (
        f"{metric}: no difference detected between {a_name} and {b_name} at alpha {alpha:g} "
        f"(Holm-adjusted {_p(adjusted_p)}; {a_name} - {b_name} = {_num(paired.mean_diff)}, "
        f"{level} CI {_num(paired.lower)} to {_num(paired.upper)}); {mde_text}"
    )
