"""Evaluation metrics over graded samples: avg@n, unbiased pass@k, maj@n, a 95% interval.

Definitions (every number in summary.json is one of these):
  avg@n   mean correctness over all n samples of all problems (= mean of per-problem accuracies).
  pass@k  mean over problems of 1 - C(n-c, k) / C(n, k), the unbiased estimator of Chen et al. (2021):
          the probability that at least one of k samples drawn without replacement from the n is correct.
  maj@n   per problem, the answer extracted most often among its n samples wins the vote; the problem
          counts as solved when that answer was graded correct. Answers are compared by their extracted
          text with whitespace removed (the trainer never parses model output itself, so '1/2' and
          '0.5' are different votes). Samples with no extracted answer do not vote. Ties go to the
          answer whose first occurrence has the lowest sample index; a problem with no votes is unsolved.
  ci95    avg@n +- 1.96 x sample std of per-problem accuracies / sqrt(problems): the interval for a
          fresh draw of problems from the same distribution (sampling noise within a problem included).
"""

from __future__ import annotations

import math
import re


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased 1 - C(n-c, k) / C(n, k) for n samples of which c are correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(samples: list[dict]) -> bool:
    """maj@n for one problem's samples (each with 'sample', 'extracted', 'correct'); rules in the module doc."""
    votes: dict[str, list[dict]] = {}
    for s in sorted(samples, key=lambda s: s["sample"]):
        if s.get("extracted") is None:
            continue
        key = re.sub(r"\s+", "", str(s["extracted"]))
        if key:
            votes.setdefault(key, []).append(s)
    if not votes:
        return False
    # max() keeps the first maximal entry, and dicts keep insertion order = first occurrence
    winner = max(votes.values(), key=len)
    return bool(winner[0]["correct"])


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
