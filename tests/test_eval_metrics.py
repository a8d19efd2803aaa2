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


# ---------------------------------------------------------------- maj@n by equivalence (answer classes)

VALUE = {"1/2": 0.5, "0.5": 0.5, "\\frac{1}{2}": 0.5, "7": 7.0, "7.0": 7.0, "x": None}


def fake_same(asked):
    """Equivalence by a lookup table; records every pair it was asked about."""

    def same(pairs):
        asked.extend(pairs)
        return [VALUE.get(a) is not None and VALUE.get(a) == VALUE.get(b) for a, b in pairs]

    return same


def classify(answers, prior=(), id_="p"):
    records = [sample(k, a, a in ("1/2", "0.5", "\\frac{1}{2}"), id_=id_) for k, a in enumerate(answers) if k >= len(prior)]
    asked: list = []
    from thinkrl.evaluation.metrics import answer_classes

    answer_classes(records, list(prior), fake_same(asked))
    return records, asked


def test_equivalent_answers_vote_together():
    records, _ = classify(["7", "1/2", "0.5", "\\frac{1}{2}", "7"])
    assert [r["answer_class"] for r in records] == [0, 1, 1, 1, 0]
    assert majority_correct(records)  # 1/2 x3 beats 7 x2; by text, '7' (2 votes) would win
    texts = [{k: v for k, v in r.items() if k != "answer_class"} for r in records]
    assert not majority_correct(texts)


def test_answer_classes_compare_only_what_they_must():
    # exact duplicates (whitespace aside) and integer pairs need no comparison; no answer, no class
    records, asked = classify(["1/2", " 1 / 2", None, "", "025", "25", "1/2", "0.5"])
    assert [r["answer_class"] for r in records] == [0, 0, None, None, 4, 4, 0, 0]
    # '25' vs '025': two integers, decided here; every answer meets each class formed before it (one round)
    assert asked == [("025", "1/2"), ("25", "1/2"), ("0.5", "1/2"), ("0.5", "025")]
    # all different: each answer meets every earlier class once, n(n-1)/2 comparisons in all
    n = 8
    records, asked = classify([f"a{k}" for k in range(n)])
    assert [r["answer_class"] for r in records] == list(range(n)) and len(asked) == n * (n - 1) // 2


def test_first_equivalent_class_wins_and_ties_keep_the_rule():
    records, _ = classify(["x", "1/2", "7", "0.5", "7.0"])  # 'x' is equivalent to nothing
    assert [r["answer_class"] for r in records] == [0, 1, 2, 1, 2]
    assert majority_correct(records)  # tie 2-2: class 1 (first seen at sample 1) beats class 2
    records, _ = classify(["7", "1/2", "7.0", "0.5"])
    assert not majority_correct(records)  # tie 2-2: '7' first seen at sample 0
    records, _ = classify([None, None, "7"])
    assert [r["answer_class"] for r in records] == [None, None, 2] and not majority_correct(records)


def test_a_resumed_problem_joins_the_classes_already_written():
    prior = [dict(sample(0, "7", False), answer_class=0), dict(sample(1, "1/2", True), answer_class=1)]
    records, asked = classify(["7", "1/2", "0.5", "7.0", "7"], prior)
    assert [r["sample"] for r in records] == [2, 3, 4] and [r["answer_class"] for r in records] == [1, 0, 0]
    assert all(r["answer_class"] for r in prior[1:]) and "answer_class" in prior[0]  # prior rows untouched


def test_summarise_counts_classes():
    rows = [dict(sample(k, a, a != "7", id_="q"), answer_class=c) for k, (a, c) in enumerate([("7", 0), ("1/2", 1), ("0.5", 1)])]
    assert summarise(rows, 3)["maj@3"] == 1.0
