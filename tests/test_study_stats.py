"""The statistics behind a study report (thinkrl/study/stats.py), against answers worked by hand (the t
distribution itself: test_t_distribution.py)."""

import json
import math
import random

import pytest

from thinkrl.study.stats import (
    Interval,
    Paired,
    holm,
    mean_interval,
    minimum_detectable_effect,
    paired_difference,
    power_of,
    t_quantile,
    verdict,
)


def test_mean_interval_hand_case():
    # [1, 2, 3]: mean 2, sd = sqrt((1 + 0 + 1) / 2) = 1, se = 1/sqrt3, df 2;
    # t_q(0.975, 2) = 0.95 * sqrt(2 / (4 * 0.975 * 0.025)) = 4.3026527...; half-width = 4.3026527 / sqrt3 = 2.4841...
    iv = mean_interval([1.0, 2.0, 3.0])
    half = 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)) / math.sqrt(3)
    assert (iv.mean, iv.sd, iv.n, iv.level) == (2.0, 1.0, 3, 0.95)
    assert iv.lower == pytest.approx(2 - half, abs=1e-10) and iv.upper == pytest.approx(2 + half, abs=1e-10)
    assert half == pytest.approx(2.48413771, abs=1e-8)
    # a lower level gives a narrower interval around the same mean
    narrow = mean_interval([1.0, 2.0, 3.0], level=0.8)
    assert iv.lower < narrow.lower < 2.0 < narrow.upper < iv.upper


def test_mean_interval_one_value_has_no_spread_and_equal_values_have_zero():
    one = mean_interval([0.7])
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.lower) and math.isnan(one.upper) and math.isnan(one.sd)
    # 0.1 three times: fsum / 3 is not exactly 0.1, the result still is, with zero spread
    same = mean_interval([0.1, 0.1, 0.1])
    assert (same.mean, same.lower, same.upper, same.sd) == (0.1, 0.1, 0.1, 0.0)


def test_paired_difference_hand_case():
    # a = [3,5,4,6], b = [2,3,3,4]: diffs [1,2,1,2], mean 1.5; squared deviations 4 * 0.25 = 1, so sd = sqrt(1/3),
    # se = sd / sqrt4 = sqrt(1/3) / 2, t = 1.5 / se = 3 * sqrt3 = 5.196152..., df 3.
    # df = 3 closed form at t = 3*sqrt3: atan(t/sqrt3) = atan(3), sqrt3 * t / (3 + t^2) = 9 / 30 = 0.3,
    # so p = 2 * (1 - F(t)) = 1 - (2/pi) * (atan(3) + 0.3) = 0.0138468...
    r = paired_difference([3.0, 5.0, 4.0, 6.0], [2.0, 3.0, 3.0, 4.0])
    assert (r.mean_diff, r.n, r.level) == (1.5, 4, 0.95)
    assert r.sd == pytest.approx(math.sqrt(1 / 3), abs=1e-15)
    assert r.t == pytest.approx(3 * math.sqrt(3), abs=1e-12)
    p_hand = 1 - (2 / math.pi) * (math.atan(3) + 0.3)
    assert p_hand == pytest.approx(0.0138468, abs=1e-7)
    assert r.p == pytest.approx(p_hand, abs=1e-9)
    se = math.sqrt(1 / 3) / 2
    assert r.lower == pytest.approx(1.5 - 3.182446305 * se, abs=1e-8)
    assert r.upper == pytest.approx(1.5 + 3.182446305 * se, abs=1e-8)


def test_paired_difference_is_antisymmetric():
    a, b = [0.61, 0.55, 0.70, 0.58], [0.57, 0.56, 0.64, 0.52]
    ab, ba = paired_difference(a, b), paired_difference(b, a)
    assert ba.mean_diff == pytest.approx(-ab.mean_diff) and ba.t == pytest.approx(-ab.t)
    assert ba.p == pytest.approx(ab.p) and (ba.lower, ba.upper) == pytest.approx((-ab.upper, -ab.lower))


def test_pairing_sees_a_difference_the_separate_intervals_hide():
    # every seed moves both arms together (10 .. 50); a beats b on every seed by 1.0 +- 0.2.
    # diffs [1.1, 0.9, 1.0, 1.2, 0.8]: mean 1.0, sd = sqrt(0.1 / 4) = 0.158, t = 1 / (0.158 / sqrt5) = 14.1, df 4
    seed_effect = [10.0, 20.0, 30.0, 40.0, 50.0]
    b = list(seed_effect)
    a = [s + d for s, d in zip(seed_effect, [1.1, 0.9, 1.0, 1.2, 0.8])]
    r = paired_difference(a, b)
    assert r.t == pytest.approx(1.0 / (math.sqrt(0.025) / math.sqrt(5)), rel=1e-9)
    assert r.p < 1e-3 and r.lower > 0.5
    ia, ib = mean_interval(a), mean_interval(b)
    # each arm alone spans ~+-20: the intervals overlap almost entirely, and b's holds a's mean
    assert ia.lower < ib.upper and ib.lower < ia.upper and ib.lower < ia.mean < ib.upper


def test_paired_difference_with_identical_differences_or_one_seed():
    shifted = paired_difference([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # diffs all 1: no spread, a real gap
    assert (shifted.mean_diff, shifted.sd, shifted.t, shifted.p) == (1.0, 0.0, math.inf, 0.0)
    assert (shifted.lower, shifted.upper) == (1.0, 1.0)
    below = paired_difference([1.0, 2.0], [2.0, 3.0])
    assert (below.t, below.p) == (-math.inf, 0.0)
    same = paired_difference([0.3, 0.4], [0.3, 0.4])  # diffs all 0: nothing to tell apart
    assert (same.mean_diff, same.t, same.p) == (0.0, 0.0, 1.0)
    r = paired_difference([0.5], [0.25])  # one seed: no spread, so nan rather than an error
    assert r.mean_diff == 0.25 and r.n == 1
    assert all(math.isnan(v) for v in (r.lower, r.upper, r.t, r.p, r.sd))


def test_empty_unequal_and_non_finite_inputs_raise_naming_the_lengths():
    with pytest.raises(ValueError, match="length 0"):
        mean_interval([])
    with pytest.raises(ValueError, match="non-finite"):
        mean_interval([1.0, math.nan])
    with pytest.raises(ValueError, match="a has length 3, b has length 2"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="length 0"):
        paired_difference([], [])
    with pytest.raises(ValueError, match="non-finite"):
        paired_difference([1.0, math.inf], [1.0, 2.0])


def test_results_serialise_as_strict_json():
    r = paired_difference([3.0, 5.0, 4.0, 6.0], [2.0, 3.0, 3.0, 4.0])
    assert json.loads(json.dumps(r.to_dict(), allow_nan=False))["mean_diff"] == 1.5
    # nan and inf have no JSON spelling: they become null
    assert paired_difference([0.5], [0.25]).to_dict()["p"] is None
    assert paired_difference([2.0, 3.0], [1.0, 2.0]).to_dict()["t"] is None
    iv = mean_interval([4.0]).to_dict()
    assert json.dumps(iv, allow_nan=False) and iv == {"mean": 4.0, "lower": None, "upper": None, "n": 1, "sd": None, "level": 0.95}
    assert isinstance(r, Paired) and isinstance(mean_interval([4.0]), Interval)


def test_holm_hand_case():
    # sorted [0.005, 0.01, 0.03, 0.04] x [4, 3, 2, 1] = [0.02, 0.03, 0.06, 0.04]; running max -> [0.02, 0.03, 0.06, 0.06];
    # back in input order (0.01, 0.04, 0.03, 0.005) -> [0.03, 0.06, 0.06, 0.02]
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)


def test_holm_caps_at_one_leaves_a_single_test_alone_and_checks_its_input():
    # sorted [0.02, 0.7, 0.9] x [3, 2, 1] = [0.06, 1.4 -> 1, 0.9]; running max -> [0.06, 1, 1]
    assert holm([0.7, 0.02, 0.9]) == pytest.approx([1.0, 0.06, 1.0])
    assert holm([0.037]) == [0.037]
    assert holm([]) == []
    # ties get the same adjusted value whichever comes first
    assert holm([0.01, 0.01]) == [0.02, 0.02]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.2, 1.5])
    # a test that could not be run (nan) stays nan and does not count: m = 2 here
    adjusted = holm([0.01, math.nan, 0.04])
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.04)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([-0.1])


def test_mde_hand_case_and_its_power():
    # n = 12, sd = 1: (t_q(0.975, 11) + t_q(0.8, 11)) / sqrt12 = (2.2009852 + 0.8755300) / 3.4641016 = 0.88811...
    mde = minimum_detectable_effect(1.0, 12)
    assert mde == pytest.approx((t_quantile(0.975, 11) + t_quantile(0.8, 11)) / math.sqrt(12), abs=1e-12)
    assert mde == pytest.approx((2.200985160 + 0.875529978) / math.sqrt(12), abs=1e-8)
    # by construction one tail alone gives exactly 0.8; the other tail adds a hair
    assert power_of(mde, 1.0, 12) == pytest.approx(0.8, abs=0.02) and power_of(mde, 1.0, 12) >= 0.8
    assert minimum_detectable_effect(2.0, 12) == pytest.approx(2 * mde)


def test_mde_power_against_simulated_paired_t_tests():
    # the approximation checked against the real test: 4000 seeded studies of 12 normal pairs at the MDE
    n, rng = 12, random.Random(0)
    mde, crit = minimum_detectable_effect(1.0, n), t_quantile(0.975, n - 1)
    hits = 0
    for _ in range(4000):
        d = [rng.gauss(mde, 1.0) for _ in range(n)]
        m = sum(d) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
        hits += abs(m / (sd / math.sqrt(n))) > crit
    assert hits / 4000 == pytest.approx(0.8, abs=0.03)


def test_mde_shrinks_like_one_over_sqrt_n_and_needs_two_pairs():
    sizes = [3, 5, 10, 20, 50, 200, 10_000]
    scaled = [minimum_detectable_effect(1.0, n) * math.sqrt(n) for n in sizes]
    # mde * sqrt(n) falls as the t quantiles do, toward z_0.975 + z_0.8 = 1.959964 + 0.841621
    assert scaled == sorted(scaled, reverse=True)
    assert scaled[-1] == pytest.approx(1.959964 + 0.841621, abs=2e-3)
    assert minimum_detectable_effect(1.0, 200) / minimum_detectable_effect(1.0, 50) == pytest.approx(0.5, abs=0.01)
    assert math.isnan(minimum_detectable_effect(1.0, 1))
    assert math.isnan(power_of(0.5, 1.0, 1))
    # power grows with the effect, and a zero effect is rejected at about the nominal rate
    assert power_of(0.0, 1.0, 12) == pytest.approx(0.05, abs=1e-12)
    assert power_of(0.2, 1.0, 12) < power_of(0.5, 1.0, 12) < power_of(1.5, 1.0, 12) < 1.0


SIG = paired_difference([3.0, 5.0, 4.0, 6.0], [2.0, 3.0, 3.0, 4.0])  # a - b = 1.5, CI 0.581 to 2.42
NOT_SIG = paired_difference([0.52, 0.61, 0.48, 0.55], [0.50, 0.63, 0.45, 0.54])  # diffs [0.02, -0.02, 0.03, 0.01]


def test_verdict_significant_higher_is_better():
    text = verdict(SIG, 0.02, 0.9, a_name="grpo", b_name="ppo", metric="accuracy")
    assert text == (
        "accuracy: grpo higher than ppo by 1.5 (95% CI 0.581 to 2.42), Holm-adjusted p=0.02, over 4 paired seeds; "
        "higher is better, so grpo did better on these seeds"
    )


def test_verdict_significant_in_the_other_direction_and_lower_is_better():
    swapped = paired_difference([2.0, 3.0, 3.0, 4.0], [3.0, 5.0, 4.0, 6.0])  # a - b = -1.5
    text = verdict(swapped, 0.02, 0.9, a_name="ppo", b_name="grpo", metric="accuracy")
    # the gap and its interval read the way the sentence does: grpo higher by 1.5, CI 0.581 to 2.42
    assert text.startswith("accuracy: grpo higher than ppo by 1.5 (95% CI 0.581 to 2.42)")
    assert text.endswith("so grpo did better on these seeds")
    loss = verdict(swapped, 0.02, 0.9, higher_is_better=False, a_name="ppo", b_name="grpo", metric="loss")
    assert loss.startswith("loss: grpo higher than ppo by 1.5") and loss.endswith("lower is better, so ppo did better on these seeds")
    loss_ab = verdict(SIG, 0.02, 0.9, higher_is_better=False, a_name="grpo", b_name="ppo", metric="loss")
    assert loss_ab.endswith("lower is better, so ppo did better on these seeds")


def test_verdict_not_significant_states_the_mde():
    mde = minimum_detectable_effect(NOT_SIG.sd, NOT_SIG.n)
    text = verdict(NOT_SIG, 0.41, mde, a_name="grpo", b_name="ppo", metric="accuracy")
    assert text.startswith("accuracy: no difference detected between grpo and ppo at alpha 0.05 (Holm-adjusted p=0.41; grpo - ppo = 0.01")
    assert text.endswith(f"these 4 seeds detect a true difference of {mde:.3g} or more 80% of the time")
    # a small raw p that Holm pushed past alpha is still "not detected", and alpha and power show as given
    strict = verdict(SIG, 0.06, 0.9, alpha=0.01, power=0.9)
    assert "no difference detected between A and B at alpha 0.01 (Holm-adjusted p=0.06" in strict
    assert strict.endswith("detect a true difference of 0.9 or more 90% of the time")


def test_verdict_never_claims_more_than_was_measured():
    texts = [
        verdict(SIG, 0.02, 0.9),
        verdict(SIG, 0.02, 0.9, higher_is_better=False),
        verdict(NOT_SIG, 0.41, 0.05),
        verdict(NOT_SIG, 1.0, math.nan),
        verdict(paired_difference([0.5], [0.4]), math.nan, math.nan),
        verdict(SIG, 0.0, 0.9),
    ]
    for text in texts:
        lower = text.lower()
        assert "reproduc" not in lower and "no effect" not in lower and "proves" not in lower
    assert "is unknown" in texts[3]
    assert "one seed cannot separate a difference from seed noise" in texts[4]
    assert "p<0.0001" in texts[5]


def test_a_verdict_without_a_better_direction_states_the_measurement_only():
    paired = paired_difference([3.0, 5.0, 4.0, 6.0], [2.0, 3.0, 3.0, 4.0])
    words = verdict(paired, 0.01, 1.0, higher_is_better=None, a_name="gspo", b_name="grpo", metric="entropy_slope", unit="replicates")
    assert words.startswith("entropy_slope: gspo higher than grpo by 1.5") and words.endswith("over 4 paired replicates")
    assert "better" not in words
    quiet = verdict(paired, 0.5, 2.0, higher_is_better=None, a_name="gspo", b_name="grpo", metric="m", unit="replicates")
    assert "these 4 replicates detect a true difference of 2 or more 80% of the time" in quiet
