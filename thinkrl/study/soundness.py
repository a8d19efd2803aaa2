"""Which finished runs of a study may enter its comparisons, and why the others may not.

A finished seed is sound for a metric unless:

- it "did not train": at least one of its updates was skipped as NaN/inf (update/skipped_nonfinite > 0 on any
  step). The arm then trained on fewer updates than its pair, or not at all (a loss that is always NaN skips
  every one and leaves the weights as they started), so its numbers are not the arm's;
- it "diverged": the metric's value at the last step that logged it is NaN or infinite, or any logged value is
  infinite. A run's final value is the value at its last step: a non-finite one is never replaced by an
  earlier finite one. A NaN before the last step is a step that measured nothing (e.g. no group kept) and is
  left out of a mean or last:N summary.

"did not train" is checked first, so a seed is counted under one reason only. The report compares arms over the
seeds sound in both, says how many finished seeds it left out, and gives no verdict for an arm with no sound seed.
"""

from __future__ import annotations

import math
from typing import Any

from thinkrl.study.spec import Metric

DIVERGED, NOT_TRAINED = "diverged", "did not train"
REASONS = (DIVERGED, NOT_TRAINED)


def number(value: Any) -> float | None:
    """A metrics.jsonl value as a float: numbers, and the text metrics.jsonl writes for NaN and infinities."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    return None


def trained(records: list[dict]) -> bool:
    """False when any update of the run was skipped as NaN/inf."""
    return not any((number(r.get("update/skipped_nonfinite")) or 0) > 0 for r in records)


def summarise(records: list[dict], metric: Metric) -> tuple[float | None, str | None]:
    """(the run's number for `metric`, None) when sound; (None, reason) when not; (None, None) when never logged."""
    if not trained(records):
        return None, NOT_TRAINED
    series = [x for x in (number(r.get(metric.name)) for r in records) if x is not None]
    if not series:
        return None, None
    if not math.isfinite(series[-1]) or any(math.isinf(x) for x in series):
        return None, DIVERGED
    return metric.of([x for x in series if math.isfinite(x)]), None


def threads(records: list[dict]) -> list[int]:
    """The torch thread counts the run's steps recorded (torch/threads), in first-seen order."""
    return list(dict.fromkeys(int(x) for x in (number(r.get("torch/threads")) for r in records) if x is not None))


def counts(reasons: dict[int, str]) -> str:
    """'2 did not train, 1 diverged' for {seed: reason} (empty string when none)."""
    return ", ".join(f"{n} {why}" for why in REASONS if (n := sum(r == why for r in reasons.values())))
