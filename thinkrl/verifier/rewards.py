"""Named, weighted rewards (reward.functions): the verifier's score plus format, length and user rewards
(built-ins in thinkrl/rewards.py).

Each entry of reward.functions is {name, function, weight, options}. `function: verifier` is the score of
verifier.grader; any other function is a 'module:function' called as fn(completion, answer, **options) and
returning a number (a grader's (number, extracted) pair counts as its number). The list replaces the default,
so the verifier's score is part of the reward only when an entry names it:

    reward:
      functions:
        - {name: correct, function: verifier, weight: 1.0}
        - {name: format, function: "thinkrl.rewards:format_boxed", weight: 0.1}
        - {name: length, function: "thinkrl.rewards:length_penalty", weight: 0.05, options: {max_chars: 2000}}

The reward the advantages see is the sum of weight x value (plus reward.overlong_buffer's penalty), logged as
reward/shaped_mean; each function's mean over the step's completions is logged as reward/<name>. The verifier's
score stays the accuracy whatever the weights: reward/mean, dynamic sampling and eval use it. A run that leaves
reward.functions alone (the verifier, weight 1) computes and logs exactly what it did before the key existed
(verifier/errors, which counts the grader's exceptions too, is logged by every run).

Reward functions read model output, i.e. untrusted text, so they run where the grader does: in VerifierPool's
workers, each (completion, function) pair a task of its own under verifier.timeout and the memory cap. A task
that runs past the limit or kills its worker scores 0 and is counted (verifier/timeouts, verifier/crashes); an
exception (sys.exit included) scores 0 and is counted (verifier/errors). As for the grader, a function that fails
so on every completion graded together (or on reward.max_failure_share of them) is broken, not the text: the run
stops naming it and its first error. A return value that is not a finite number stops the run with an error
naming the function: a reward function must map every text to a finite number, and so must the weighted sum
(a float32 for the advantages), or the step's advantages would all be 0 or NaN.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

from thinkrl.errors import UserError
from thinkrl.verifier.grading import load_grader

VERIFIER = "verifier"  # the function value that stands for verifier.grader's score
FAILED = ("raised", "timeout", "crash")  # reports of a call that failed (it scores 0), as opposed to "ok" and "bad"
FLOAT32_MAX = 3.4028234663852886e38  # rewards become a float32 tensor: a larger weighted sum is inf there


def call(spec: tuple[str, dict], completion: str, answer: str, loaded: dict) -> tuple[str, Any]:
    """In a verifier worker: one reward function on one completion -> ("ok", value), ("raised", the exception)
    or ("bad", why the value is unusable). `loaded` caches the imported functions by 'module:function'."""
    function, options = spec
    try:
        if function not in loaded:
            loaded[function] = load_grader(function, "reward function")
    except Exception as e:  # UserError: importable in the trainer but not here (another path?)
        return "bad", f"could not be loaded in a verifier worker ({e})"
    try:
        value = loaded[function](completion, answer, **options)
    except BaseException as e:  # untrusted text may break a function: 0, counted (never the worker's end)
        return "raised", f"{type(e).__name__}: {e}"[:200]
    if isinstance(value, tuple) and len(value) == 2:  # a grader's (score, extracted)
        value = value[0]
    if isinstance(value, numbers.Real):  # int, float, bool, numpy scalars
        return "ok", float(value)
    return "bad", f"returned {_short(value)} ({type(value).__name__}), not a number"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class RewardSet:
    """reward.functions in the trainer: loaded and checked once, then per step the pool call that evaluates them
    and the weighted sum of what comes back.

    rs = RewardSet(cfg.reward.functions)
    scores, extracted, parts, stats = rs.evaluate(pool, texts, answers)   # parts: one value per entry, per text
    rewards, logged = rs.totals(parts), rs.means(parts)                  # logged: {'reward/<name>': mean}
    """

    def __init__(self, entries: list, max_failure_share: float = 1.0) -> None:
        """max_failure_share: reward.max_failure_share, the share of the completions graded together on which one
        function may fail (raise, time out, kill its worker) before the run stops; 1.0: only all of them stop it."""
        from thinkrl.config.rollout import default_reward_functions

        self.entries, self.max_failure_share = list(entries), max_failure_share
        self.custom = self.entries != default_reward_functions()  # the default logs no reward/<name>
        self.weights = [e.weight for e in self.entries]
        self.specs = []  # (function, options) of the entries the workers run, in order
        for e in self.entries:
            if e.function != VERIFIER:
                _check_signature(load_grader(e.function, f"reward.functions {e.name}: function"), e)
                self.specs.append((e.function, dict(e.options)))

    def evaluate(self, pool, texts: list[str], answers: list) -> tuple[list[float], list, list[list[float]], dict[str, int]]:
        """The verifier's scores and extracted answers, each text's values (one per entry, in the entries' order)
        and the pool's counts: {'timeouts', 'crashes', 'errors'} (errors: exceptions of the grader and reward functions)."""
        if not self.specs:
            scores, extracted, stats = pool.grade(texts, answers)
            values: list = []
        else:
            scores, extracted, values, stats = pool.evaluate(texts, answers, self.specs)
            raised = sum(r is not None and r[0] == "raised" for column in values for r in column)
            stats = {**stats, "errors": stats.get("errors", 0) + raised}
        worker_columns = iter(values)
        columns = [scores if e.function == VERIFIER else _numbers(e, next(worker_columns)) for e in self.entries]
        for entry, column in zip((e for e in self.entries if e.function != VERIFIER), values):
            _check_failures(entry, column, self.max_failure_share)
        parts = [list(row) for row in zip(*columns)]
        self.totals(parts)  # each text's weighted sum is checked where its values are: also in groups dynamic sampling drops
        return scores, extracted, parts, stats

    def totals(self, parts: list[list[float]]) -> list[float]:
        """Each text's reward: the sum of weight x value (for the default, exactly the verifier's score). A sum that is
        not a finite float32 (a finite value times its weight can overflow) is the user's error, as a value is."""
        out = []
        for row in parts:
            total = sum(w * v for w, v in zip(self.weights, row))
            if not abs(total) <= FLOAT32_MAX:  # inf, and NaN (inf - inf), fail this too
                raise UserError(_overflow(self.entries, self.weights, row, total))
            out.append(total)
        return out

    def means(self, parts: list[list[float]]) -> dict[str, float]:
        """{'reward/<name>': mean value over the texts}, NaN with none (a step that kept no group has no mean, and 0.0
        would read as one); nothing for the default reward.functions."""
        if not self.custom:
            return {}
        return {f"reward/{e.name}": sum(row[j] for row in parts) / len(parts) if parts else math.nan for j, e in enumerate(self.entries)}


def _check_signature(fn, entry) -> None:
    """A function that cannot take (completion, answer, **options) would fail on every text: say so now."""
    try:
        inspect.signature(fn).bind("completion", "answer", **entry.options)
    except TypeError as e:
        options = "".join(f", {k}=..." for k in entry.options)
        call = f"fn(completion, answer{options})"
        raise UserError(f"reward.functions {entry.name}: {entry.function} cannot be called as {call} ({e})") from None
    except ValueError:  # no signature to inspect (a builtin): the workers will find out
        pass


def _numbers(entry, column: list) -> list[float]:
    """The workers' reports for one function -> floats: a timeout, crash or exception is 0.0; an unusable value is
    the user's error (the function, not the text, is wrong)."""
    out = []
    for report in column:
        kind, value = report if report is not None else ("crash", None)
        if kind == "bad" or (kind == "ok" and not math.isfinite(value)):
            why = value if kind == "bad" else f"returned {value}, not a finite number"
            raise UserError(f"reward.functions {entry.name} ({entry.function}) {why}; a reward function must return a finite number")
        out.append(value if kind == "ok" else 0.0)
    return out


def _check_failures(entry, column: list, share: float) -> None:
    """Stop the run when one function failed (raised, exited, timed out, killed its worker) on `share` or more of the
    completions graded together, two or more: then the function is broken, not the text (the grader's rule, with
    its threshold reward.max_failure_share). Fewer failures score 0 and are counted in the step's verifier/* metrics."""
    failed = [r[1] if r is not None else "no result from its worker" for r in column if r is None or r[0] in FAILED]
    if len(column) < 2 or not failed or len(failed) / len(column) < share:
        return
    every = len(failed) == len(column)
    how = f"every one of the {len(column)}" if every else f"{len(failed)} of the {len(column)}"
    limit = "" if every else f", reward.max_failure_share={share:g} or more"
    first = " ".join(str(failed[0]).split())  # an exception's text may hold newlines: the error stays one line
    raise UserError(
        f"reward.functions {entry.name} ({entry.function}) failed on {how} completions graded together (the first: {first}){limit}, "
        "so the function is broken, not the text; fix it (call it on one completion to see the traceback)"
    )


def _overflow(entries: list, weights: list[float], row: list[float], total: float) -> str:
    """The error for a weighted sum that is not a finite float32: the terms that overflow, else every non-zero one."""
    terms = [(e, w, v) for e, w, v in zip(entries, weights, row) if w * v != 0]
    named = [t for t in terms if not abs(t[1] * t[2]) <= FLOAT32_MAX] or terms
    listing = " and ".join(f"{e.name} ({e.function}) returned {v:g} x weight {w:g}" for e, w, v in named)
    return (
        f"reward.functions {listing}: the weighted sum {total:g} is not a finite number as the float32 the advantages "
        f"use (at most {FLOAT32_MAX:.4g}); lower the weight or bound what the function returns"
    )
