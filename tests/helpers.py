"""Grading functions with faults, for the verifier-pool tests (imported by spawned workers)."""

import os
import time

from thinkrl.verifier import grade


def sleepy_grade(completion: str, answer: str):
    if completion == "sleep":
        time.sleep(60)
    return grade(completion, answer)


def crashing_grade(completion: str, answer: str):
    if completion == "crash":
        os._exit(1)  # the worker dies mid-sample, as on an out-of-memory kill
    return grade(completion, answer)


def length_reward(completion: str, answer: str):
    """A test grader with varied rewards for any model: (length of the completion mod 3) / 2. The tiny
    random model never solves arithmetic, so with the real grader every group would be all-zero and the
    plumbing tests would never exercise a real update."""
    return (len(completion) % 3) / 2, None


def even_answers_solved(completion: str, answer: str):
    """Groups whose answer is even all score 1 (no signal, dropped by dynamic sampling); the others get
    length_reward's varied scores."""
    if int(answer) % 2 == 0:
        return 1.0, None
    return length_reward(completion, answer)


# reward functions for reward.functions (tests/test_rewards.py): (completion, answer) -> a number


def distinct_chars(completion: str, answer: str) -> float:
    """Varied values for any model: the share of 20 distinct characters the completion uses."""
    return min(len(set(completion)), 20) / 20


def sleepy_reward(completion: str, answer: str) -> float:
    if completion == "sleep":
        time.sleep(60)
    return 0.5


def odd_reward(completion: str, answer: str):
    """A reward function with bugs: a string for "text", NaN for "nan", an exception for "raise"."""
    if completion == "raise":
        raise KeyError(completion)
    return {"text": "high", "nan": float("nan")}.get(completion, 1.0)


def failing_reward(completion: str, answer: str, how: str = "raise") -> float:
    """Fails on every text: "raise" a KeyError, "exit" sys.exit(3), "sleep" past any test's verifier.timeout,
    "nan" returns NaN, "huge" returns 1e308 (finite, but not times a weight of 10)."""
    import sys

    if how == "exit":
        sys.exit(3)
    if how == "sleep":
        time.sleep(60)
    if how == "nan":
        return float("nan")
    if how == "huge":
        return 1e308
    raise KeyError("score_key")


def odd_length_failing_reward(completion: str, answer: str) -> float:
    """Raises on completions of odd length (some texts break it), distinct_chars on the others."""
    if len(completion) % 2:
        raise ValueError("cannot parse")
    return distinct_chars(completion, answer)


# graders with bugs (tests/test_bad_returns.py): what a verifier.grader may return, right and wrong


def shaped_grade(completion: str, answer: str):
    """Returns what the completion names: "string" a str, "none" None, "two" a score of 2.0, "nan" a NaN score,
    "triple" three values, "bare" a bare 1.0, "sympy" an extracted answer that is not a str, "raise" raises;
    anything else (1.0, completion)."""
    if completion == "raise":
        raise ZeroDivisionError("division by zero")
    shapes = {
        "string": "1.0",
        "none": None,
        "two": (2.0, None),
        "nan": (float("nan"), None),
        "triple": (1.0, None, 3),
        "bare": 1.0,
        "sympy": (1, 42),
    }
    return shapes.get(completion, (1.0, completion))


def always_raising_grade(completion: str, answer: str):
    """A broken grader: it fails on every text."""
    raise KeyError("answer_key")


def odd_length_raising_grade(completion: str, answer: str):
    """Raises on completions of odd length (a grader that some texts break); length_reward on the others."""
    if len(completion) % 2:
        raise ValueError("cannot parse")
    return length_reward(completion, answer)


def string_grade(completion: str, answer: str):
    """Returns a string, not (score, extracted)."""
    return "correct"


def assert_second_correction_refused_unless_anchor_old(method: str, mode: str) -> None:
    """A method whose ratio is taken against the sampler mu (method.anchor=behav) refuses any correction.mode (tis, mis, icepop, ipo):
    r = pi_theta / mu already corrects each token from mu, and TIS/MIS would multiply by pi_old / mu again. With
    anchor=old, r = pi_theta / pi_old and the correction bridges mu -> pi_old (thinkrl/learner/correction.py)."""
    import pytest

    from thinkrl.errors import UserError
    from thinkrl.methods import get_method
    from thinkrl.settings import load_config, resolve

    expected = rf"^correction.mode={mode} with method {method}: its ratio is already taken against the sampler mu"
    with pytest.raises(UserError, match=expected) as e:
        resolve(load_config(overrides=[f"correction.mode={mode}"], **{"method.name": method}))
    assert "set correction.mode=none, or method.anchor=old" in str(e.value) and "\n" not in str(e.value)
    cfg = resolve(load_config(overrides=[f"correction.mode={mode}", "method.anchor=old"], **{"method.name": method}))
    assert cfg.correction.mode == mode
    assert get_method(method).mismatch_corrected == "all" and get_method(method, anchor="old").mismatch_corrected == "none"
