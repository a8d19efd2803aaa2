import time

import pytest

from thinkrl.verifier import VerifierPool, extract_boxed, grade, score

TABLE = [
    # (completion, gold, expected score)
    ("The answer is 42.", "42", 1.0),  # exact, unboxed
    ("\\boxed{42}", "42", 1.0),  # boxed
    ("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # symbolic: fraction vs decimal
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{4}}", "1/2", 1.0),
    ("\\boxed{025}", "25", 1.0),  # leading zeros
    ("first \\boxed{3} then \\boxed{7}", "7", 1.0),  # last box wins
    ("first \\boxed{7} then \\boxed{3}", "7", 0.0),
    ("\\boxed{41}", "42", 0.0),  # wrong
    ("", "42", 0.0),  # empty completion
    ("The answer is \\boxed{}.", "5", 0.0),  # empty box scores 0 even when the text has the number
    ("3 + 2 = 5, answer \\boxed{}", "5", 0.0),
    ("\\boxed{4", "4", 0.0),  # unbalanced box: nothing well-formed to grade
    ("}{}{\\\\ $$ \\frac{", "1", 0.0),  # malformed LaTeX
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),
    # integer answers must be stated as numbers: restating the question's expression is not an answer
    ("66 + 24 is a classic example of addition", "90", 0.0),
    ("\\boxed{5+5}", "10", 0.0),
    ("\\boxed{2 \\cdot 45}", "90", 0.0),
    ("66 + 24 = 90", "90", 1.0),
    ("\\boxed{90 \\text{ apples}}", "90", 1.0),
    ("\\boxed{\\frac{180}{2}}", "90", 1.0),
    ("\\boxed{-5}", "-5", 1.0),
    ("\\boxed{5.0}", "5", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
]


@pytest.mark.parametrize("completion, gold, expected", TABLE)
def test_score_table(completion, gold, expected):
    assert score(completion, gold) == expected


def test_extract_boxed():
    assert extract_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{1} and \\boxed{2}") == "2"
    assert extract_boxed("\\fbox{9}") == "9"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{}") == ""


def test_grade_returns_the_extracted_answer():
    assert grade("so \\boxed{ 12 }", "12") == (1.0, "12")
    assert grade("I think 7", "8")[1] == "7"


def test_pool_scores_match_in_process_scores():
    completions = [c for c, _, _ in TABLE]
    golds = [g for _, g, _ in TABLE]
    with VerifierPool(workers=2, timeout=10) as pool:
        scores, stats = pool.score(completions, golds)
    assert scores == [e for _, _, e in TABLE]
    assert stats == {"timeouts": 0, "crashes": 0, "errors": 0}


def test_pool_times_out_a_slow_sample_and_keeps_going():
    from helpers import sleepy_grade

    with VerifierPool(workers=1, timeout=0.5, grade_fn=sleepy_grade) as pool:
        start = time.monotonic()
        scores, extracted, stats = pool.grade(["sleep", "\\boxed{3}", "sleep", "\\boxed{4}"], ["1", "3", "1", "5"])
        elapsed = time.monotonic() - start
    assert scores == [0.0, 1.0, 0.0, 0.0]
    assert extracted[0] is None and extracted[1] == "3"
    assert stats["timeouts"] == 2
    assert elapsed < 30  # two timed-out samples cost about 2 x 0.5 s plus worker restarts, not 2 x 60 s


def test_pool_survives_a_worker_crash():
    from helpers import crashing_grade

    with VerifierPool(workers=2, timeout=10, grade_fn=crashing_grade) as pool:
        scores, _, stats = pool.grade(["crash", "\\boxed{3}", "\\boxed{2}"], ["1", "3", "2"])
    assert scores == [0.0, 1.0, 1.0]
    assert stats["crashes"] == 1


# MATH-500-style LaTeX answers, and AIME integers (the eval grading table of the eval issue)
MATH_TABLE = [
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),  # tuple
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
    ("\\boxed{(-\\infty, 2]}", "(-\\infty,2]", 1.0),  # interval
    ("\\boxed{(-\\infty, 2)}", "(-\\infty,2]", 0.0),  # open vs closed end
    ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", 1.0),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),  # degrees
    ("\\boxed{10\\text{ cm}}", "10", 1.0),  # text units
    ("\\boxed{\\$18}", "18", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("The final answer is $\\boxed{033}$", "33", 1.0),  # AIME leading zeros
    ("\\boxed{33.5}", "33", 0.0),
]


@pytest.mark.parametrize("completion, gold, expected", MATH_TABLE)
def test_math500_style_table(completion, gold, expected):
    assert score(completion, gold) == expected


def test_power_tower_returns_within_the_time_limit_and_scores_zero():
    tower = "\\boxed{" + "9^{" * 12 + "9" + "}" * 12 + "}"
    with VerifierPool(workers=1, timeout=3.0) as pool:
        start = time.monotonic()
        scores, stats = pool.score([tower, "\\boxed{7}"], ["5", "7"])
        elapsed = time.monotonic() - start
    assert scores == [0.0, 1.0]
    assert elapsed < 3.0 + 30  # the limit plus, at most, restarting one worker
