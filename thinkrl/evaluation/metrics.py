"""Evaluation metrics over graded samples: avg@n, unbiased pass@k, maj@n, a 95% interval.

Definitions (every number in summary.json is one of these):
  avg@n   mean correctness over all n samples of all problems (= mean of per-problem accuracies).
  pass@k  mean over problems of 1 - C(n-c, k) / C(n, k), the unbiased estimator of Chen et al. (2021):
          the probability that at least one of k samples drawn without replacement from the n is correct.
  maj@n   per problem, the answers of its n samples are grouped into classes of equivalent answers and
          the class with the most samples wins the vote; the problem counts as solved when that class's
          first sample was graded correct. Equivalence is math equivalence by the verifier's own
          comparison, so '1/2', '0.5' and '\\frac{1}{2}' are one vote: each sample's class is decided once,
          when the sample is graded (`answer_classes`, in the verifier's worker processes under their time
          limit), and recorded in samples.jsonl as `answer_class`, the sample index of the class's first
          member. An answer joins the first class (in order of formation) whose first answer is equivalent
          to it; answers equal as text with whitespace removed need no comparison, nor do two integers; so a
          problem costs at most n(n-1)/2 comparisons, and a comparison that runs past the limit counts as
          different. Samples with no extracted answer do not vote. Ties go to the class whose first
          occurrence has the lowest sample index; a problem with no votes is unsolved. (Samples written
          without `answer_class`, by earlier versions, vote by their text with whitespace removed.)
  ci95    avg@n +- 1.96 x sample std of per-problem accuracies / sqrt(problems): the interval for a
          fresh draw of problems from the same distribution (sampling noise within a problem included).
  outcomes  how many samples were correct, wrong, without an answer, truncated, timed out or crashed the
          grader (`zero_reason` of each sample that scored 0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased 1 - C(n-c, k) / C(n, k) for n samples of which c are correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def vote_key(extracted) -> str | None:
    """An answer's text identity: whitespace removed; None (no vote) when nothing was extracted."""
    key = re.sub(r"\s+", "", str(extracted)) if extracted is not None else ""
    return key or None


def _vote(s: dict):
    if "answer_class" in s:
        return None if s["answer_class"] is None else ("class", s["answer_class"])
    key = vote_key(s.get("extracted"))
    return None if key is None else ("text", key)


def majority_correct(samples: list[dict]) -> bool:
    """maj@n for one problem's samples (each with 'sample', 'extracted', 'correct' and, when graded by this
    version, 'answer_class'); rules in the module doc."""
    votes: dict[object, list[dict]] = {}
    for s in sorted(samples, key=lambda s: s["sample"]):
        key = _vote(s)
        if key is not None:
            votes.setdefault(key, []).append(s)
    if not votes:
        return False
    # max() keeps the first maximal entry, and dicts keep insertion order = first occurrence
    winner = max(votes.values(), key=len)
    return bool(winner[0]["correct"])


Same = Callable[[list[tuple[str, str]]], list[bool]]
_INT = re.compile(r"[+-]?\d{1,100}")  # two integers are compared here, without a worker


class _Problem:
    """One problem's classes while they form: text key -> class id, the classes' first answers, and the
    records still to place (by sample index)."""

    def __init__(self) -> None:
        self.of_key: dict[str, int | None] = {}
        self.firsts: list[tuple[int, str]] = []  # (class id, its first answer's text), in order of formation
        self.pending: list[dict] = []

    def place(self, r: dict, cls: int | None) -> None:
        r["answer_class"] = cls
        key = vote_key(r.get("extracted"))
        if key is not None and key not in self.of_key:
            self.of_key[key] = cls
            if cls == r["sample"]:
                self.firsts.append((cls, str(r["extracted"])))

    def next_to_compare(self) -> dict | None:
        """Places the pending records that need no comparison; returns the first one that does (or None)."""
        while self.pending:
            r = self.pending[0]
            key = vote_key(r.get("extracted"))
            if key is not None and key not in self.of_key and self.firsts:
                return r
            self.place(self.pending.pop(0), None if key is None else self.of_key.get(key, r["sample"]))
        return None


def answer_classes(records: list[dict], prior: list[dict], same: Same) -> None:
    """Set each record's 'answer_class' (maj@n's vote, module doc): the sample index of the first member of
    its class of equivalent answers, None without an answer. `prior`: rows already in samples.jsonl (with
    their classes), which a record of the same problem may join. `same(pairs)` says, for (answer, first
    answer of a class) pairs, which are equivalent; it is called once per round with every problem's next
    unplaced answer against all classes so far (thinkrl.verifier.same_answers runs them in the pool)."""
    problems: dict[str, _Problem] = {}
    for r in sorted(records, key=lambda r: r["sample"]):
        problems.setdefault(r["id"], _Problem()).pending.append(r)
    for r in sorted(prior, key=lambda r: r["sample"]):
        p = problems.get(r["id"])
        if p is not None and r.get("answer_class") is not None:
            p.place(r, r["answer_class"])  # written already: it keeps its class
    while True:
        todo = [(p, r) for p in problems.values() if (r := p.next_to_compare()) is not None]
        if not todo:
            return
        asks, decided = [], []  # pairs for `same`; per record, its classes' verdicts (None: asked)
        for p, r in todo:
            a = str(r["extracted"])
            verdicts = []
            for _, first in p.firsts:
                if _INT.fullmatch(a.strip()) and _INT.fullmatch(first.strip()):
                    verdicts.append(int(a) == int(first))
                else:
                    verdicts.append(None)
                    asks.append((a, first))
            decided.append(verdicts)
        answers = iter(same(asks) if asks else [])
        for (p, r), verdicts in zip(todo, decided):
            verdicts = [v if v is not None else bool(next(answers)) for v in verdicts]
            match = next((cls for (cls, _), v in zip(p.firsts, verdicts) if v), r["sample"])
            p.place(p.pending.pop(0), match)


def ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n (and n itself when it is not a power of two)."""
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    if out[-1] != n:
        out.append(n)
    return out


def summarise(samples: list[dict], n: int) -> dict[str, float]:
    """Metrics for one dataset from its samples.jsonl records (all problems must have n samples)."""
    by_id: dict[str, list[dict]] = {}
    for s in samples:
        by_id.setdefault(s["id"], []).append(s)
    if not by_id:
        return {}
    acc = [sum(s["correct"] for s in v) / len(v) for v in by_id.values()]  # per-problem accuracy
    P = len(acc)
    avg = sum(acc) / P
    sd = math.sqrt(sum((a - avg) ** 2 for a in acc) / (P - 1)) if P > 1 else 0.0
    out = {
        f"avg@{n}": avg,
        f"avg@{n}_ci95_low": max(0.0, avg - 1.96 * sd / math.sqrt(P)),
        f"avg@{n}_ci95_high": min(1.0, avg + 1.96 * sd / math.sqrt(P)),
    }
    for k in ks(n):
        out[f"pass@{k}"] = sum(pass_at_k(len(v), sum(s["correct"] for s in v), k) for v in by_id.values()) / P
    out[f"maj@{n}"] = sum(majority_correct(v) for v in by_id.values()) / P
    out["length/mean"] = sum(s["length"] for s in samples) / len(samples)
    out["truncated_frac"] = sum(s["truncated"] for s in samples) / len(samples)
    return out


# ---------------------------------------------------------------- the eval table (thinkrl/cli.py)


def table_cell(m: dict, key: str) -> str:
    """One metric for the table: 3 decimals, and avg@n with its 95% interval, '0.350 [0.21, 0.49]'."""
    if not isinstance(m.get(key), float):
        return str(m.get(key, ""))
    low, high = m.get(f"{key}_ci95_low"), m.get(f"{key}_ci95_high")
    return f"{m[key]:.3f}" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def truncation_warning(summary: dict) -> str | None:
    """A line for when over half of a dataset's completions hit the token budget (their answers cut off)."""
    frac = summary["metrics"].get("truncated_frac", 0.0)
    if frac <= 0.5:
        return None
    budget = summary.get("settings", {}).get("max_new_tokens")
    return (
        f"warning: {Path(summary['dataset']).stem}: {frac:.0%} of the completions hit the {budget}-token budget, so most "
        "answers were cut off before they were given; raise --max-new-tokens"
    )


def print_table(summaries: list[dict]) -> None:
    """The console table of `thinkrl eval`: one row per dataset, each metric with its 95% interval."""
    from rich.table import Table

    from thinkrl.run.console import console, shown

    keys = list(dict.fromkeys(k for s in summaries for k in s["metrics"] if not k.endswith(("_low", "_high"))))
    table = Table(title="thinkrl eval (avg@n [95% interval])")
    for col in ["dataset", "problems", *keys]:
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for s in summaries:
        table.add_row(shown(Path(s["dataset"]).stem), str(s["problems"]), *(table_cell(s["metrics"], k) for k in keys))
    console.print(table)
    for line in filter(None, map(truncation_warning, summaries)):  # most answers cut off by the budget
        console.print(f"[yellow]{shown(line)}[/]")


def zero_reason(correct: bool, extracted, truncated: bool, failure: str | None = None) -> str | None:
    """Why a sample scored 0: 'timeout' / 'crash' (the verifier ran past its limit or its worker died), 'truncated'
    (no answer, cut off by the token budget), 'no answer', or 'wrong'; None when it is correct."""
    if correct:
        return None
    if failure:
        return failure
    if extracted is None:
        return "truncated" if truncated else "no answer"
    return "wrong"


OUTCOMES = ("correct", "wrong", "no answer", "truncated", "timeout", "crash")


def outcomes(rows: list[dict]) -> dict[str, int]:
    """How many samples ended each way (rows written before zero_reason was recorded: from their fields)."""
    out = dict.fromkeys(OUTCOMES, 0)
    for r in rows:
        why = r["zero_reason"] if "zero_reason" in r else zero_reason(r["correct"], r.get("extracted"), r.get("truncated", False))
        key = why or "correct"
        out[key] = out.get(key, 0) + 1
    return out
