"""maj@n by math equivalence through the verifier pool: '1/2', '0.5' and '\\frac{1}{2}' are one vote, a
hostile answer costs the pool's time limit and no more, and `thinkrl eval` records each sample's class."""

import functools
import json
import time

import pytest
from test_eval_cli import invoke
from transformers import PreTrainedTokenizerBase

import thinkrl.verifier as verifier
from thinkrl.evaluation.metrics import answer_classes, majority_correct, summarise
from thinkrl.run.jsonl import read_jsonl
from thinkrl.verifier import VerifierPool, same_answers

TIMEOUT = 2.5
MARGIN = 15.0  # replacing a timed-out worker re-imports sympy (tests/test_hostile.py)
TOWER = "9^{9^{9^{9^9}}}"  # compared with a fraction, math-verify grinds until the time limit


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(workers=2, timeout=TIMEOUT) as p:
        yield p


def rows(answers, correct):
    return [{"id": "p", "sample": k, "extracted": a, "correct": a in correct} for k, a in enumerate(answers)]


def test_the_verifier_decides_equivalence(pool):
    pairs = [("0.5", "1/2"), ("\\frac{1}{2}", "1/2"), ("\\frac{2}{4}", "0.5"), ("7", "1/2"), ("025", "25"), ("66 + 24", "90")]
    # the integer rule of the grader holds here too: an expression is not the integer it evaluates to
    assert same_answers(pool, pairs) == [True, True, True, False, True, False]
    assert same_answers(pool, []) == []


def test_fractions_in_three_notations_vote_together(pool):
    samples = rows(["7", "1/2", "0.5", "\\frac{1}{2}", "7", "7.0"], correct={"1/2", "0.5", "\\frac{1}{2}"})
    assert not majority_correct(samples)  # by text: '7' has 2 votes, each fraction 1
    answer_classes(samples, [], lambda pairs: same_answers(pool, pairs))
    assert [s["answer_class"] for s in samples] == [0, 1, 1, 1, 0, 0]
    assert not majority_correct(samples)  # 3-3 tie: the class first seen (sample 0, '7') wins
    assert majority_correct(samples[1:])  # without sample 0: 1/2 x3 beats 7 x2


def test_a_hostile_answer_costs_the_time_limit(pool):
    samples = rows(["1/2", TOWER, "0.5", "\\frac{1}{2}", TOWER], correct={"1/2", "0.5", "\\frac{1}{2}"})
    workers, t0 = set(pool.pids), time.monotonic()
    answer_classes(samples, [], lambda pairs: same_answers(pool, pairs))
    elapsed = time.monotonic() - t0
    assert set(pool.pids) != workers  # a comparison did run into the limit: its worker was replaced
    assert [s["answer_class"] for s in samples] == [0, 1, 0, 0, 1]  # the tower's duplicate needs no comparison
    assert elapsed < 2 * (TIMEOUT + MARGIN)  # two rounds of comparisons, each at most one time limit
    assert majority_correct(samples)
    assert same_answers(pool, [("1/2", "0.5")]) == [True]  # and the pool grades on


def write_task(path, answer):
    path.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"Solve {i + 1}.", "answer": answer}) + "\n" for i in range(2)))
    return path


def eval_args(model, data, out, n):
    sampling = ["--n", str(n), "--max-new-tokens", "4", "--temperature", "1"]
    return ["--model", str(model), "--dataset", str(data), *sampling, "--output", str(out)]


@pytest.mark.plain
def test_eval_records_answer_classes(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    invoke(*eval_args(tiny_model_dir, write_task(tmp_path / "task.jsonl", "1/2"), out, 3))
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 6 and all("answer_class" in s for s in samples)
    for s in samples:  # no answer, no class; else the sample index of its class's first member, at most its own
        assert (s["answer_class"] is None) == (s["extracted"] is None or not s["extracted"].strip())
        assert s["answer_class"] is None or 0 <= s["answer_class"] <= s["sample"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["maj@3"] == summarise(samples, 3)["maj@3"]


@pytest.mark.plain
def test_eval_groups_equivalent_answers_and_survives_a_hostile_one(tiny_model_dir, tmp_path, monkeypatch):
    # the completions are replaced; the gold is an integer, so grading the tower is quick (it is not a number)
    # but comparing it with the fraction, the class formed before it, runs into the pool's time limit
    texts = ["so \\boxed{1/2}", f"\\boxed{{{TOWER}}}", "\\boxed{0.5}", "\\boxed{7}"]
    monkeypatch.setattr(PreTrainedTokenizerBase, "batch_decode", lambda self, seqs, **kw: [texts[i % 4] for i in range(len(seqs))])
    monkeypatch.setattr(verifier, "VerifierPool", functools.partial(VerifierPool, timeout=TIMEOUT))
    out = tmp_path / "out"
    t0 = time.monotonic()
    invoke(*eval_args(tiny_model_dir, write_task(tmp_path / "task.jsonl", "7"), out, 4))
    assert time.monotonic() - t0 < 120
    samples = read_jsonl(out / "samples.jsonl")
    assert [s["extracted"] for s in samples[:4]] == ["1/2", TOWER, "0.5", "7"]
    assert [s["answer_class"] for s in samples] == [0, 1, 0, 3] * 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["maj@4"] == 0.0 and summary["metrics"]["avg@4"] == pytest.approx(0.25)  # 1/2 x2 outvotes 7
