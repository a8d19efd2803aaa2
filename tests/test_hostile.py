"""Hostile completions through VerifierPool: each scores 0 (or its legitimate score) within the time limit
plus a margin, nothing in it is executed, and the pool keeps grading afterwards. (What happens to the
worker processes themselves: test_verifier_workers.py.)"""

import time
from pathlib import Path

import pytest

import thinkrl.verifier as verifier
from thinkrl.verifier import VerifierPool

TIMEOUT = 2.5
# Replacing a worker after a timeout or crash re-imports sympy: about a second here, several on a loaded
# 2-core machine.
MARGIN = 15.0
MARKER = "PWNED"  # replaced by a path under tmp_path: the file exists only if something ran the text
TESTS = Path(__file__).parent

FRAC_TOWER = "\\frac{1}{" * 500 + "2" + "}" * 500
HOSTILE = [  # (id, completion, gold answer, expected score)
    # power towers: the box is parsed; with a non-integer gold math-verify's comparison would grind on
    # 9^(9^(9^(9^9))) until the pool's time limit
    ("tower-boxed", "\\boxed{9^{9^{9^{9^9}}}}", "5", 0.0),
    ("tower-boxed-fraction-gold", "\\boxed{9^{9^{9^{9^9}}}}", "\\frac{1}{2}", 0.0),
    ("tower-plain", "so the answer is 9^9^9^9^9", "5", 0.0),
    ("tower-plain-fraction-gold", "so the answer is 9^9^9^9^9", "\\frac{1}{2}", 0.0),
    ("factorial-of-huge", "\\boxed{(10^{10})!}", "\\frac{1}{2}", 0.0),
    # nesting and size
    ("1e5-nested-parens", "(" * 10**5 + ")" * 10**5, "1", 0.0),
    ("1e5-nested-braces-boxed", "\\boxed{" + "{" * 10**5 + "1" + "}" * 10**5 + "}", "1", 0.0),
    ("1e5-nested-parens-boxed", "\\boxed{" + "(" * 10**5 + "1" + ")" * 10**5 + "}", "1", 0.0),
    ("1mb-text", "x" * 2**20, "1", 0.0),
    ("1mb-digits", "1" * 2**20, "1", 0.0),
    ("1mb-box", "\\boxed{" + "1+" * 2**19 + "1}", "1", 0.0),
    ("1mb-text-then-correct-box", "x " * 2**19 + "\\boxed{7}", "7", 1.0),
    ("1000-empty-boxes", "\\boxed{}" * 1000, "1", 0.0),
    ("1000-empty-boxes-then-correct", "\\boxed{}" * 1000 + " so \\boxed{3}", "3", 1.0),
    ("1e5-unclosed-boxes", "\\boxed{" * 10**5, "1", 0.0),
    ("1e5-unclosed-boxes-after-correct", "\\boxed{3} " + "\\boxed{" * 10**5, "3", 1.0),
    ("nested-frac-500", "\\boxed{" + FRAC_TOWER + "}", "2", 0.0),  # it is 2, but not stated as a number
    ("nested-frac-500-plain", "$" + FRAC_TOWER + "$", "2", 0.0),
    ("huge-integer-boxed", "\\boxed{" + "9" * 999 + "}", "1", 0.0),
    ("huge-integer-boxed-correct", "\\boxed{" + "9" * 999 + "}", "9" * 999, 1.0),
    ("huge-integer-plain", "The answer is " + "9" * 10**5, "1", 0.0),
    # text that is not valid UTF-8: lone surrogates (as Python decodes invalid bytes with
    # surrogateescape), replacement characters, control characters and NULs
    ("lone-surrogates-around-correct", "\ud800 \udfff\udc80 \\boxed{5} \ud83d", "5", 1.0),
    ("lone-surrogate-in-box", "\\boxed{\ud800}", "5", 0.0),
    ("surrogateescape-bytes", b"\xff\xfe\xc3(\\boxed{5}\x80".decode("utf-8", "surrogateescape"), "5", 1.0),
    ("replacement-chars", "\ufffd" * 1000 + "\\boxed{5}", "5", 1.0),
    ("control-chars-around-correct", "\x00\x01\x07\x1b[2J\x7f\x1b]0;title\x07 \\boxed{7}\x00", "7", 1.0),
    ("nul-in-box", "\\boxed{\x007}", "7", 0.0),
    ("only-nuls", "\x00" * 10**5, "0", 0.0),
    # text that looks like code: graded, never run
    ("python", f"__import__('os').system('touch {MARKER}')", "0", 0.0),
    ("python-boxed", f"\\boxed{{__import__('os').system('touch {MARKER}')}}", "0", 0.0),
    ("python-eval-boxed", f"\\boxed{{eval(\"open('{MARKER}', 'w')\")}}", "0", 0.0),
    ("python-expr-answer", f"The answer: (lambda: __import__('os').system('touch {MARKER}'))() = 0", "1", 0.0),
    # shell substitutions (harmless commands on purpose: a broken verifier must not take a home directory with it)
    ("shell", f"$(touch {MARKER}) `touch {MARKER}`; touch {MARKER} && echo 1", "2", 0.0),
    ("shell-boxed", f"\\boxed{{$(touch {MARKER})}}", "0", 0.0),
    ("latex-file-commands", f"\\input{{{MARKER}}} \\write18{{touch {MARKER}}} \\boxed{{\\immediate\\write18{{touch {MARKER}}}}}", "0", 0.0),
]
ORDINARY = ("Adding them gives \\boxed{12}.", "12")
# math-verify's comparison grinds on these until the pool's limit; everything else must be quick
MAY_TIME_OUT = {"tower-boxed-fraction-gold", "tower-plain-fraction-gold", "factorial-of-huge"}


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(workers=2, timeout=TIMEOUT) as p:
        yield p


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_completion_scores_and_the_pool_keeps_working(pool, case, tmp_path):
    name, completion, answer, expected = case
    marker = tmp_path / "pwned"
    completion = completion.replace(MARKER, str(marker))
    start = time.monotonic()
    scores, _, stats = pool.grade([completion], [answer])
    elapsed = time.monotonic() - start
    assert scores == [expected], stats
    assert elapsed < TIMEOUT + MARGIN
    assert stats["crashes"] == 0  # hostile input costs at most a time-out, never a dead worker
    assert stats["timeouts"] == 0 or name in MAY_TIME_OUT
    assert not marker.exists(), "the completion's text was executed"
    assert pool.score([ORDINARY[0]], [ORDINARY[1]])[0] == [1.0]


def test_all_hostile_completions_in_one_batch(pool, tmp_path):
    """Mixed with ordinary completions, as a training step would see them; order is kept."""
    completions, answers, expected = [], [], []
    for _, completion, answer, score in HOSTILE:
        completions += [completion.replace(MARKER, str(tmp_path / "pwned")), ORDINARY[0]]
        answers += [answer, ORDINARY[1]]
        expected += [score, 1.0]
    start = time.monotonic()
    scores, _, stats = pool.grade(completions, answers)
    elapsed = time.monotonic() - start
    assert scores == expected, stats
    assert stats["crashes"] == 0 and stats["timeouts"] <= len(MAY_TIME_OUT)
    assert not (tmp_path / "pwned").exists()
    # the time-outs run two at a time; everything else is fast
    assert elapsed < (stats["timeouts"] + 1) * (TIMEOUT + MARGIN)


def test_box_extraction_is_linear_in_the_text():
    """The old extraction matched every box from scratch: minutes on 10^5 unclosed boxes."""
    start = time.monotonic()
    assert verifier.extract_boxed("\\boxed{" * 10**5) is None
    assert verifier.extract_boxed("\\boxed{3}" + "\\boxed{" * 10**5 + "{" * 10**5) == "3"
    assert verifier.extract_boxed("\\boxed{}" * 1000) == ""
    assert time.monotonic() - start < 5


def test_invalid_unicode_survives_the_round_trip(pool):
    """Lone surrogates reach the worker and come back in the extracted answer unchanged."""
    weird = "\ud800x\udfff\x00"
    scores, extracted, _ = pool.grade([f"\\boxed{{{weird}}}", "\udc80 \\boxed{4}"], ["1", "4"])
    assert scores == [0.0, 1.0] and extracted == [weird, "4"]
