"""pass@k, maj@n and the summary of evaluation samples (thinkrl/evaluation/metrics.py)."""

import math

import pytest

from thinkrl.evaluation.metrics import ks, majority_correct, pass_at_k, summarise


# n = 4 samples, c correct: pass@k = 1 - C(4-c, k) / C(4, k), by hand
@pytest.mark.parametrize(
    "c, expected",
    [
        (0, [0.0, 0.0, 0.0, 0.0]),
        (1, [1 / 4, 1 - 3 / 6, 1 - 1 / 4, 1.0]),  # C(3,1)/C(4,1)=3/4; C(3,2)/C(4,2)=3/6; C(3,3)/C(4,3)=1/4
        (2, [2 / 4, 1 - 1 / 6, 1.0, 1.0]),  # C(2,1)/4=1/2; C(2,2)/6=1/6; C(2,3)=0
        (3, [3 / 4, 1.0, 1.0, 1.0]),
        (4, [1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_pass_at_k_hand_cases(c, expected):
    assert [pass_at_k(4, c, k) for k in (1, 2, 3, 4)] == pytest.approx(expected)


def test_pass_at_1_is_the_mean_and_bad_arguments_raise():
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def sample(k, extracted, correct, length=10, truncated=False, id_="p"):
    return {"id": id_, "sample": k, "extracted": extracted, "correct": correct, "length": length, "truncated": truncated}


def test_majority_vote_rules():
    # plain majority: '5' x2 beats '7'
    assert majority_correct([sample(0, "7", False), sample(1, "5", True), sample(2, " 5", True)])
    # tie 1-1: the answer seen first (lowest sample index) wins
    assert not majority_correct([sample(1, "5", True), sample(0, "7", False)])
    assert majority_correct([sample(0, "5", True), sample(1, "7", False)])
    # samples without an extracted answer do not vote; no votes at all = unsolved
    assert majority_correct([sample(0, None, False), sample(1, None, False), sample(2, "5", True)])
    assert not majority_correct([sample(0, None, False), sample(1, "", False)])


def test_summarise_two_problems():
    rows = [
        sample(0, "1", True, 10, False, "a"),
        sample(1, "2", False, 20, True, "a"),
        sample(0, "3", False, 30, False, "b"),
        sample(1, "3", False, 40, False, "b"),
    ]
    m = summarise(rows, 2)
    assert m["avg@2"] == pytest.approx(0.25)
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["maj@2"] == pytest.approx(0.5)  # a: tie 1-1, first is '1' (correct); b: '3' wrong
    assert m["length/mean"] == 25 and m["truncated_frac"] == 0.25
    half_width = 1.96 * math.sqrt(((0.5 - 0.25) ** 2 + (0 - 0.25) ** 2) / 1) / math.sqrt(2)
    assert m["avg@2_ci95_low"] == pytest.approx(max(0, 0.25 - half_width))
    assert m["avg@2_ci95_high"] == pytest.approx(0.25 + half_width)


def test_ks():
    assert ks(1) == [1] and ks(4) == [1, 2, 4] and ks(6) == [1, 2, 4, 6] and ks(32)[-1] == 32
