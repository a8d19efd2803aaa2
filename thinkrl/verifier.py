"""Grade math answers: score(completion, answer) -> 1.0 or 0.0, with math-verify.

Extraction: the content of the last \\boxed{...} when the completion has one (an empty box scores 0);
otherwise math-verify's own LaTeX/expression extraction over the completion's tail. The gold answer is
parsed first and compared with `verify(gold, prediction)` (math-verify's argument order matters).
When the gold answer is an integer (AIME, GSM8K, arithmetic), the prediction must be a number: "025" and
"\\frac{180}{2}" count for 25 and 90, an unevaluated expression such as "66 + 24" does not.

Completions are model output, i.e. untrusted text: the trainer never parses them itself. `VerifierPool`
grades in worker processes with a per-sample time limit and an address-space limit; a sample that runs
past the limit, or whose worker dies, scores 0, is counted, and the worker is replaced.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import Connection, wait

TAIL_CHARS = 4000  # unboxed fallback: answers sit at the end; bounds the text math-verify scans


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) with balanced braces; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    while start != -1:
        i = text.find("{", start)
        if i != -1 and text[start:i].replace(" ", "") in ("\\boxed", "\\fbox"):
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        # unbalanced or malformed: try the box before it
        start = max(text.rfind("\\boxed", 0, start), text.rfind("\\fbox", 0, start))
    return None


def grade(completion: str, answer: str) -> tuple[float, str | None]:
    """(1.0 or 0.0, the extracted final answer or None). Runs math-verify on untrusted text: call it
    in a worker process (VerifierPool), never in the trainer."""
    from math_verify import parse, verify

    box = extract_boxed(completion)
    if box is not None:
        box = box.strip()
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


def load_grader(spec: str):
    """'module:function' -> the function (imported here and, by reference, in each worker)."""
    import importlib

    from thinkrl.errors import UserError

    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise UserError(f"verifier.grader={spec!r} could not be loaded ({e}); expected 'module:function'") from None
    if not callable(fn):
        raise UserError(f"verifier.grader={spec!r} is not a function")
    return fn


def _worker(conn: Connection, memory_mb: int, grade_fn) -> None:
    """Worker process: receive (index, completion, answer), send back (index, (score, extracted))."""
    import resource

    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    score("\\boxed{1}", "1")  # import and warm math-verify/sympy before the first real sample
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        idx, completion, answer = msg
        try:
            value = grade_fn(completion, answer)
        except Exception:  # malformed input must score 0, never kill the worker
            value = (0.0, None)
        conn.send((idx, value))


class VerifierPool:
    """Worker processes that grade completions with a per-sample time limit.

    pool = VerifierPool(workers=2, timeout=5.0)
    rewards, stats = pool.score(completions, answers)   # stats: timeouts, crashes
    scores, extracted, stats = pool.grade(completions, answers)
    pool.close()
    """

    def __init__(self, workers: int = 2, timeout: float = 5.0, memory_mb: int = 4096, grade_fn=grade) -> None:
        """grade_fn: a module-level function (completion, answer) -> (score, extracted); tests inject faults here."""
        self.timeout, self.memory_mb, self.grade_fn = timeout, memory_mb, grade_fn
        self._ctx = mp.get_context("spawn")  # never fork the trainer (torch threads, CUDA state)
        self._workers: list[tuple[mp.Process, Connection] | None] = [self._spawn() for _ in range(max(1, workers))]
        for i, w in enumerate(self._workers):
            self._await_ready(i, w)

    def _spawn(self) -> tuple[mp.Process, Connection]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.memory_mb, self.grade_fn), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _await_ready(self, i: int, w) -> None:
        proc, conn = w
        try:
            if not conn.poll(120):  # importing sympy can be slow on a cold disk
                raise RuntimeError("verifier worker did not start within 120 s")
            conn.recv()
        except EOFError:
            proc.join(5)
            raise RuntimeError(f"verifier worker exited during start-up (exit code {proc.exitcode}); see its error above") from None

    def _replace(self, i: int) -> None:
        proc, conn = self._workers[i]
        proc.kill()
        proc.join()
        conn.close()
        self._workers[i] = self._spawn()
        self._await_ready(i, self._workers[i])

    def score(self, completions: list[str], answers: list[str]) -> tuple[list[float], dict[str, int]]:
        scores, _, stats = self.grade(completions, answers)
        return scores, stats

    def grade(self, completions: list[str], answers: list[str]) -> tuple[list[float], list[str | None], dict[str, int]]:
        """Scores, extracted answers and {'timeouts', 'crashes'}; a timed-out or crashed sample gets (0, None)."""
        results: list[tuple[float, str | None]] = [(0.0, None)] * len(completions)
        stats = {"timeouts": 0, "crashes": 0}
        todo = list(range(len(completions)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (sample index, start time)
        while todo or busy:
            for i in range(len(self._workers)):
                if i not in busy and todo:
                    idx = todo.pop()
                    self._workers[i][1].send((idx, completions[idx], str(answers[idx])))
                    busy[i] = (idx, time.monotonic())
            conns = {self._workers[i][1]: i for i in busy}
            now = time.monotonic()
            next_deadline = min(start + self.timeout for _, start in busy.values())
            for conn in wait(list(conns), timeout=max(0.0, next_deadline - now)):
                i = conns[conn]
                try:
                    idx, (value, extracted) = conn.recv()
                    results[idx] = (float(value), extracted)
                except (EOFError, OSError):  # worker died mid-sample (e.g. out of memory)
                    stats["crashes"] += 1
                    self._replace(i)
                del busy[i]
            now = time.monotonic()
            for i, (_, start) in list(busy.items()):
                if now - start > self.timeout:
                    stats["timeouts"] += 1
                    self._replace(i)
                    del busy[i]
        return [r[0] for r in results], [r[1] for r in results], stats

    def close(self) -> None:
        for w in self._workers:
            if w is None:
                continue
            proc, conn = w
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
            conn.close()
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
