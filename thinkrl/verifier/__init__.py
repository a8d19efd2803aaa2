"""The verifier: math answers graded with math-verify, in isolated worker processes.

grading.py  extract_boxed, grade (the default verifier.grader), score, load_grader, same_answers (maj@n)
pool.py     VerifierPool: workers with a per-sample time limit and a memory cap; crashes and timeouts score 0

Completions are model output, i.e. untrusted text: the trainer never parses them itself; every call of
grade() on a completion happens inside a pool worker.
"""

from thinkrl.verifier.grading import MAX_ANSWER_CHARS, TAIL_CHARS, extract_boxed, grade, grader_name, load_grader, same_answers, score
from thinkrl.verifier.pool import VerifierPool

__all__ = [
    "MAX_ANSWER_CHARS",
    "TAIL_CHARS",
    "VerifierPool",
    "extract_boxed",
    "grade",
    "grader_name",
    "load_grader",
    "same_answers",
    "score",
]
