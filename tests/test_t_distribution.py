"""The t distribution behind the study statistics (thinkrl/study/stats.py t_cdf, t_quantile).

Closed forms for df = 1, 2, 3 and a numeric integral of the t density are the second, independent method
every tabulated value here is checked against.
"""

import math

import pytest

from thinkrl.study.stats import t_cdf, t_quantile


def t_density(t, df):
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi) * (1 + t * t / df) ** (-(df + 1) / 2)


def cdf_by_integration(t, df, steps=4000):
    """0.5 + the integral of the density from 0 to t, by composite Simpson: shares no code with t_cdf."""
    h = t / steps
    s = t_density(0.0, df) + t_density(t, df) + sum((4 if i % 2 else 2) * t_density(i * h, df) for i in range(1, steps))
    return 0.5 + s * h / 3


def cdf_df3(t):
    # F(t) = 1/2 + (1/pi) * (atan(t / sqrt3) + sqrt3 * t / (3 + t^2)) for three degrees of freedom
    return 0.5 + (math.atan(t / math.sqrt(3)) + math.sqrt(3) * t / (3 + t * t)) / math.pi


@pytest.mark.parametrize("df", [1, 2, 3, 7.5, 30, 1e6])
def test_t_cdf_is_one_half_at_zero_and_symmetric(df):
    assert t_cdf(0.0, df) == 0.5
    for t in (0.1, 1.0, 2.5, 10.0):
        assert t_cdf(-t, df) == pytest.approx(1 - t_cdf(t, df), abs=1e-14)
        assert t_cdf(-t, df) < 0.5 < t_cdf(t, df)


def test_t_cdf_df1_is_cauchy_and_keeps_far_tail_digits():
    # F(t) = 1/2 + atan(t) / pi; atan(1) = pi/4, so F(1) = 3/4 exactly
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-14)
    for t in (-30.0, -2.0, 0.3, 5.0, 300.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
    # df = 1: P(T < -1e6) = 1/2 - atan(1e6)/pi = atan(1e-6)/pi ~ 3.183e-7; 1 - F(1e6) would keep ~9 digits only
    assert t_cdf(-1e6, 1) == pytest.approx(math.atan(1e-6) / math.pi, rel=1e-10)
    assert t_cdf(math.inf, 5) == 1.0 and t_cdf(-math.inf, 5) == 0.0


@pytest.mark.parametrize("t", [-8.0, -1.0, -0.01, 0.5, 2.0, 4.303, 50.0])
def test_t_cdf_df2_and_df3_closed_forms(t):
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)
    assert t_cdf(t, 3) == pytest.approx(cdf_df3(t), abs=1e-13)


@pytest.mark.parametrize("t, df", [(0.7, 4), (1.9, 9.5), (2.2, 10), (3.1, 25), (0.05, 60)])
def test_t_cdf_matches_the_integrated_density(t, df):
    assert t_cdf(t, df) == pytest.approx(cdf_by_integration(t, df), abs=1e-10)


@pytest.mark.parametrize("df", [1, 5, 40])
def test_t_cdf_near_zero_follows_the_density(df):
    # F(t) - 1/2 ~ f(0) * t for tiny t; df / (df + t^2) rounds to 1.0 here, so this fails if 1 - x is used for t^2 / (df + t^2)
    for t in (1e-9, 1e-6):
        assert t_cdf(t, df) - 0.5 == pytest.approx(t_density(0.0, df) * t, rel=1e-6)
    assert t_quantile(0.5 + 1e-10, df) == pytest.approx(1e-10 / t_density(0.0, df), rel=1e-5)


def test_t_cdf_approaches_the_normal_for_large_df():
    for x in (-3.0, -1.0, 0.4, 1.96, 3.0):
        assert t_cdf(x, 1e6) == pytest.approx(0.5 * (1 + math.erf(x / math.sqrt(2))), abs=1e-5)
    # and is visibly not normal at df = 3: the tails are fatter
    assert t_cdf(-3.0, 3) > 0.5 * (1 + math.erf(-3 / math.sqrt(2))) + 0.02


# the tabulated two-sided 95% and one-sided 80% points; each is re-derived below by integrating the density
TABLE = [
    (0.975, 1, 12.706204736), (0.975, 3, 3.182446305), (0.975, 10, 2.228138852),
    (0.975, 30, 2.042272456), (0.8, 5, 0.919543780), (0.8, 11, 0.875529978),
]  # fmt: skip


@pytest.mark.parametrize("p, df, expected", TABLE)
def test_t_quantile_hits_the_table_and_the_table_checks_out(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-8)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-8)
    # independent of t_cdf: the density integrated up to the (9-decimal) table value gives p, to the rounding
    assert cdf_by_integration(expected, df) == pytest.approx(p, abs=2e-9)


def test_t_quantile_df1_and_df2_closed_forms():
    for p in (0.001, 0.1, 0.42, 0.8, 0.975, 0.9999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-10)


@pytest.mark.parametrize("df", [1, 2.5, 4, 11, 100])
def test_t_quantile_inverts_t_cdf(df):
    for p in (1e-6, 0.025, 0.3, 0.5, 0.7, 0.975, 1 - 1e-6):
        assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


def test_t_quantile_edges_and_bad_arguments():
    assert t_quantile(0.5, 7) == 0.0
    assert t_quantile(1.0, 7) == math.inf and t_quantile(0.0, 7) == -math.inf
    with pytest.raises(ValueError, match="probability"):
        t_quantile(1.2, 7)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.9, 0)
