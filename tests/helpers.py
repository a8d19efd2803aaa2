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
