"""Grade one math answer: grade(completion, answer) -> (score, extracted), with math-verify.

Extraction: the content of the last \\boxed{...} when the completion has one (an empty box scores 0);
otherwise math-verify's own LaTeX/expression extraction over the completion's tail. The gold answer is
parsed first and compared with `verify(gold, prediction)` (math-verify's argument order matters).
When the gold answer is an integer (AIME, GSM8K, arithmetic), the prediction must be a number: "025" and
"\\frac{180}{2}" count for 25 and 90, an unevaluated expression such as "66 + 24" does not.

Extraction is linear in the completion's length and a boxed answer longer than MAX_ANSWER_CHARS scores 0
unparsed, so long or deeply nested output costs a pass over the text, not a sympy parse
(tests/test_hostile.py). These functions run on untrusted text: only inside thinkrl/verifier/pool.py's workers.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thinkrl.verifier.pool import VerifierPool

TAIL_CHARS = 4000  # unboxed fallback: answers sit at the end; bounds the text math-verify scans
MAX_ANSWER_CHARS = 1000  # a longer boxed "answer" is not one (MATH answers are < 200 chars): 0, unparsed
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox) *\{")
_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces; None if there is none.

    One pass over the braces with a stack: a box that never closes falls back to the one before it, and
    matching each box from scratch would be quadratic on output such as a thousand unclosed boxes."""
    opens = [m.end() - 1 for m in _BOX_OPEN.finditer(text)]  # index of each box's "{"
    if not opens:
        return None
    closing: dict[int, int] = {}  # "{" index -> index of its matching "}"
    stack: list[int] = []
    for m in _BRACE.finditer(text, opens[0]):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:  # a stray "}" closes nothing
            closing[stack.pop()] = m.start()
    for i in reversed(opens):  # the last box that closes
        if i in closing:
            return text[i + 1 : closing[i]]
    return None


def grade(completion: str, answer: str) -> tuple[float, str | None]:
    """(1.0 or 0.0, the extracted final answer or None). Runs math-verify on untrusted text: call it
    in a worker process (VerifierPool), never in the trainer."""
    from math_verify import parse, verify

    box = extract_boxed(completion)
    if box is not None:
        box = box.strip()
        if len(box) > MAX_ANSWER_CHARS:  # e.g. 10^5 nested brackets: parsing would only run into the time limit
            return 0.0, box[:MAX_ANSWER_CHARS]
        pred = parse("\\boxed{" + box + "}") if box else []
        extracted = box or None
    else:
        pred = parse(completion[-TAIL_CHARS:])
        extracted = str(pred[-1]) if pred else None
    gold = parse("\\boxed{" + str(answer) + "}") or parse(str(answer))
    if not gold or not pred:
        return 0.0, extracted
    if getattr(gold[0], "is_Integer", False) and not getattr(pred[0], "is_Number", False):
        # An integer answer must be stated as a number. math-verify would evaluate an expression such as
        # "66 + 24" and accept it for 90, and a policy learns to restate the question to collect that reward.
        return 0.0, extracted
    return (1.0 if verify(gold, pred) else 0.0), extracted


def score(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer equals `answer` (symbolically), else 0.0."""
    return grade(completion, answer)[0]


def same_answers(pool: VerifierPool, pairs: list[tuple[str, str]]) -> list[bool]:
    """For maj@n (thinkrl/evaluation/metrics.py): is each (answer, class's first answer) pair equivalent by the
    verifier's own comparison? Decided in the pool's workers, under their time and memory limits: the answer is
    graded as the completion \\boxed{answer} with the class's first answer as the gold. A pair that runs past
    the limit (or crashes a worker) counts as different."""
    scores, _, _ = pool.grade(["\\boxed{" + a + "}" for a, _ in pairs], [b for _, b in pairs]) if pairs else ([], None, None)
    return [s == 1.0 for s in scores]


def load_grader(spec: str, key: str = "verifier.grader"):
    """'module:function' -> the function (imported here and, by reference, in each worker); `key` names the
    setting in the error."""
    import importlib

    from thinkrl.errors import UserError

    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise UserError(f"{key}={spec!r} could not be loaded ({e}); expected 'module:function'") from None
    if not callable(fn):
        raise UserError(f"{key}={spec!r} is not a function")
    return fn


def grader_name(fn) -> str:
    """'module:function' of a grade function, as verifier.grader spells it."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
