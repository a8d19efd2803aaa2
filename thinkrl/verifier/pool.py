"""Grading in worker processes: the trainer never parses a completion itself.

`VerifierPool` grades in worker processes with a per-sample time limit and an address-space limit; a sample
that runs past the limit, or whose worker dies, scores 0, is counted, and the worker is replaced. What a
grader returns is checked in the worker: (score in [0, 1], extracted answer or None), or a bare score;
anything else stops the run with one line naming the grader. An exception scores 0 and is counted (errors),
unless it happens on every completion graded together: then the grader is broken, and that is an error too.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import numbers
import time
from multiprocessing.connection import Connection, wait

from thinkrl.errors import short
from thinkrl.verifier.grading import MAX_ANSWER_CHARS, grade, grader_name, score

CRASHED = ("crash", "killed its verifier worker (out of memory, or it exited the process)")  # a task's report when its worker died


def _worker(conn: Connection, memory_mb: int, grade_fn) -> None:
    """Worker process: receive (task, function, completion, answer), send back (task, result): for function
    None grade_fn's (score, extracted), otherwise what thinkrl.verifier.rewards.call reports for that reward function."""
    import logging
    import resource

    from thinkrl.verifier import rewards

    _tie_to_trainer()
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # math-verify logs every timed-out sample in full (up to megabytes of model output) on the trainer's
    # terminal; the pool counts those samples instead
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    score("\\boxed{1}", "1")  # import and warm math-verify/sympy before the first real sample
    loaded: dict = {}  # reward functions imported so far, by their 'module:function'
    try:
        conn.send(("ready", None))
        while True:
            msg = conn.recv()
            if msg is None:
                return
            task, function, completion, answer = msg
            if function is not None:
                value = rewards.call(function, completion, answer, loaded)
            else:
                value = _grade_report(grade_fn, completion, answer)
            conn.send((task, value))
    except (EOFError, OSError):  # the trainer is gone
        return


def _grade_report(grade_fn, completion: str, answer: str) -> tuple[str, object]:
    """In a worker: grade_fn on one completion -> ("ok", (score, extracted)), ("raised", the exception) or ("bad",
    what is wrong with the value it returned). A bare number stands for (score, None), as thinkrl/verifier/rewards.py takes
    a grader's pair for its number; the score must be in [0, 1] (it is the accuracy), and an extracted answer
    that is not a string (a sympy expression, an int) is sent as its str()."""
    try:
        value = grade_fn(completion, answer)
    except BaseException as e:  # malformed input scores 0, is counted, and never kills the worker; math-verify's
        return "raised", f"{type(e).__name__}: {e}"[:200]  # TimeoutException derives from BaseException, not Exception
    if isinstance(value, (tuple, list)) and len(value) == 2:
        score, extracted = value
    elif isinstance(value, numbers.Real):
        score, extracted = value, None
    else:
        return "bad", f"returned {short(value)} ({type(value).__name__}), not (score, extracted answer or None)"
    if not isinstance(score, numbers.Real) or not 0 <= score <= 1:  # NaN fails the range too
        return "bad", f"returned the score {short(score)} ({type(score).__name__}), not a number in [0, 1]"
    if extracted is not None and not isinstance(extracted, str):
        extracted = str(extracted)[:MAX_ANSWER_CHARS]
    return "ok", (float(score), extracted)


def _tie_to_trainer() -> None:
    """Make the trainer the only one that ends this worker.

    Linux: the kernel sends SIGKILL when the trainer dies, even by SIGKILL, so no worker is left grinding
    a hostile sample for nobody (an idle worker ends anyway, on the pipe's EOF). Then SIGINT and SIGTERM
    are ignored: Ctrl-C and a scheduler's SIGTERM reach the whole process group, and the trainer's
    graceful stop still needs its workers to grade the last step. (PR_SET_PDEATHSIG fires when the thread
    that started the worker exits: create a VerifierPool in a thread that outlives it.)"""
    import ctypes
    import os
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: keep the default signal handling
        return
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the trainer died before prctl took effect
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class VerifierPool:
    """Worker processes that grade completions with a per-sample time limit.

    pool = VerifierPool(workers=2, timeout=5.0)
    rewards, stats = pool.score(completions, answers)   # stats: timeouts, crashes, errors (the grader raised)
    scores, extracted, stats = pool.grade(completions, answers)
    scores, extracted, values, stats = pool.evaluate(completions, answers, functions)   # reward.functions
    pool.close()
    """

    def __init__(self, workers: int = 2, timeout: float = 5.0, memory_mb: int = 4096, grade_fn=grade) -> None:
        """grade_fn: a module-level function (completion, answer) -> (score, extracted); tests inject faults here.
        It travels to the workers by reference (module and name) and each worker imports it afresh."""
        self.timeout, self.memory_mb, self.grade_fn = timeout, memory_mb, grade_fn
        self.last_failures: dict[int, str] = {}  # of the last evaluate() call: completion index -> "timeout" / "crash"
        self._ctx = mp.get_context("spawn")  # never fork the trainer (torch threads, CUDA state)
        # Workers ignore SIGTERM, and multiprocessing's own exit hook would SIGTERM them and wait for ever:
        # close first (atexit runs last-registered first, and multiprocessing registered its hook on import),
        # which also covers a start-up cut short (Ctrl-C while sympy imports) with some workers running.
        self._workers: list[tuple[mp.Process, Connection] | None] = []
        atexit.register(self.close)
        for _ in range(max(1, workers)):
            self._workers.append(self._spawn())
        for i, w in enumerate(self._workers):
            self._await_ready(i, w)

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring, and for the tests that kill one)."""
        return [w[0].pid for w in self._workers if w is not None]

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

    def _send(self, i: int, msg) -> bool:
        """Hand worker i a sample; False (and the worker replaced) if it had died while idle."""
        proc, conn = self._workers[i]
        try:
            if proc.is_alive():
                conn.send(msg)
                return True
        except OSError:  # BrokenPipeError: it died between is_alive and send
            pass
        self._replace(i)
        return False

    def score(self, completions: list[str], answers: list[str]) -> tuple[list[float], dict[str, int]]:
        scores, _, stats = self.grade(completions, answers)
        return scores, stats

    def grade(self, completions: list[str], answers: list[str]) -> tuple[list[float], list[str | None], dict[str, int]]:
        """Scores, extracted answers and {'timeouts', 'crashes', 'errors'}; a sample that timed out, crashed its worker
        or made the grader raise gets (0, None) (errors: how many raised; see _grades for what stops instead)."""
        scores, extracted, _, stats = self.evaluate(completions, answers)
        return scores, extracted, stats

    def evaluate(self, completions: list[str], answers: list[str], functions: list | tuple = ()) -> tuple[list[float], list, list, dict]:
        """grade(), plus reward functions (specs for thinkrl.verifier.rewards.call) on every completion, in the same workers:
        each (completion, function) pair is a task of its own under the time limit. values[f][i]: what the worker
        reported for function f on completion i, or ("timeout" / "crash", why) when that task timed out or crashed
        (counted in stats; it scores 0).
        Afterwards `last_failures` maps each completion whose grading timed out or crashed to "timeout" / "crash"
        (thinkrl eval records it per sample)."""
        n_f = len(specs := [None, *functions])  # None: grade_fn
        results: list = [None] * (len(completions) * n_f)  # task t: completion t // n_f, spec t % n_f
        stats = {"timeouts": 0, "crashes": 0}
        failures: dict[int, str] = {}  # completion -> why its grade task got no result
        todo = list(range(len(results)))[::-1]
        resent: set[int] = set()
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (task, start time)
        while todo or busy:
            for i in range(len(self._workers)):
                if i not in busy and todo:
                    t = todo.pop()
                    if self._send(i, (t, specs[t % n_f], completions[t // n_f], str(answers[t // n_f]))):
                        busy[i] = (t, time.monotonic())
                    else:  # the worker had died while idle (killed from outside): a crash, but not this
                        stats["crashes"] += 1  # sample's doing, so it goes to the replacement (once; then it scores 0)
                        if t not in resent:
                            resent.add(t)
                            todo.append(t)
                        else:
                            results[t] = CRASHED
                            if t % n_f == 0:
                                failures[t // n_f] = "crash"
            if not busy:  # every send found a dead worker: hand the samples to the replacements
                continue
            conns = {self._workers[i][1]: i for i in busy}
            now = time.monotonic()
            next_deadline = min(start + self.timeout for _, start in busy.values())
            for conn in wait(list(conns), timeout=max(0.0, next_deadline - now)):
                i = conns[conn]
                try:
                    t, value = conn.recv()
                    results[t] = value
                except (EOFError, OSError):  # worker died mid-sample (e.g. out of memory, or killed)
                    stats["crashes"] += 1
                    results[busy[i][0]] = CRASHED
                    if busy[i][0] % n_f == 0:
                        failures[busy[i][0] // n_f] = "crash"
                    self._replace(i)
                del busy[i]
            now = time.monotonic()
            for i, (_, start) in list(busy.items()):
                # poll: a result that arrived while another worker was being replaced is not a timeout
                if now - start > self.timeout and not self._workers[i][1].poll():
                    stats["timeouts"] += 1
                    results[busy[i][0]] = ("timeout", f"ran past verifier.timeout={self.timeout:g} s")
                    if busy[i][0] % n_f == 0:
                        failures[busy[i][0] // n_f] = "timeout"
                    self._replace(i)
                    del busy[i]
        self.last_failures = failures
        graded, stats["errors"] = self._grades(results[::n_f])
        values = [results[f::n_f] for f in range(1, n_f)]
        return [g[0] for g in graded], [g[1] for g in graded], values, stats

    def _grades(self, reports: list) -> tuple[list[tuple[float, str | None]], int]:
        """The workers' reports on grade_fn -> (score, extracted) per completion, and how many raised. A timeout,
        crash or exception scores (0.0, None): untrusted text may break a grader. A return value of the wrong shape,
        or an exception on every completion (two or more), is the grader's fault, not the text's: a UserError."""
        from thinkrl.errors import UserError

        name = grader_name(self.grade_fn)
        bad = next((r[1] for r in reports if r is not None and r[0] == "bad"), None)
        if bad is not None:
            raise UserError(f"verifier.grader {name} {bad}; a grader returns (score in [0, 1], extracted answer or None)")
        raised = [r[1] for r in reports if r is not None and r[0] == "raised"]
        if len(reports) >= 2 and len(raised) == len(reports):
            raise UserError(
                f"verifier.grader {name} raised on every one of the {len(reports)} completions graded together (the first: "
                f"{raised[0]}), so the grader is broken, not the text; fix it (call it on one completion to see the traceback)"
            )
        return [r[1] if r is not None and r[0] == "ok" else (0.0, None) for r in reports], len(raised)

    def close(self) -> None:
        atexit.unregister(self.close)
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
