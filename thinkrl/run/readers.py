"""Reading run directories after (or during) training: `thinkrl compare`, `thinkrl show`, and the data of
`thinkrl plot`. Everything here reads metrics.jsonl, rollouts.jsonl and config.yaml; nothing writes."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl


@dataclass
class Run:
    path: Path
    label: str  # the method, plus the directory name when two runs share a method
    method: str
    metrics: list[dict]

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, skipping steps without a finite number for it."""
        pairs = [(m["step"], float(m[key])) for m in self.metrics if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def keys(self) -> list[str]:
        return list(dict.fromkeys(k for m in self.metrics for k in m))


def load_runs(paths: list[Path]) -> list[Run]:
    runs = []
    for path in paths:
        if not (path / "metrics.jsonl").is_file():
            raise UserError(f"{path}: no metrics.jsonl, so not a thinkrl run directory (pass RUN_DIR, e.g. runs/demo)")
        config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
        method = (config.get("method") or {}).get("name", "?")
        metrics = read_jsonl(path / "metrics.jsonl")
        if not metrics:
            raise UserError(f"{path}/metrics.jsonl is empty: the run has not finished a step yet")
        runs.append(Run(path, method, method, metrics))
    counts = Counter(r.method for r in runs)
    for r in runs:
        if counts[r.method] > 1:
            r.label = f"{r.method} ({r.path.name})"
    return runs


def eval_keys(run: Run) -> list[str]:
    """The accuracy metrics logged by in-training evaluation: eval/<dataset>/avg@n."""
    return [k for k in run.keys() if k.startswith("eval/") and "/avg@" in k]


# ---------------------------------------------------------------- compare

COMPARE = [
    ("reward/mean", "reward"),
    ("entropy", "entropy"),
    ("length/mean", "length"),
    ("clip/frac", "clip frac"),
    ("mask/frac", "mask frac"),
]


def compare_rows(runs: list[Run], tail: int) -> tuple[list[str], list[list[str]]]:
    """A table with one column per run: each metric's final value (mean of the last `tail` steps) and its
    highest value with the step it was reached at ("best" for reward and accuracy, "max" for the rest)."""
    evals = list(dict.fromkeys(k for r in runs for k in eval_keys(r)))
    metrics = [(k, name) for k, name in COMPARE if any(r.series(k)[0] for r in runs)] + [(k, k.removeprefix("eval/")) for k in evals]
    header = ["", *(r.label for r in runs)]
    rows = [["steps", *(str(r.metrics[-1]["step"]) for r in runs)]]
    for key, name in metrics:
        final, best = [f"{name} final"], [f"{name} {'best' if key == 'reward/mean' or key.startswith('eval/') else 'max'} (step)"]
        for r in runs:
            steps, values = r.series(key)
            if not values:
                final.append("-")
                best.append("-")
                continue
            i = values.index(max(values))
            final.append(f"{sum(values[-tail:]) / len(values[-tail:]):.3f}")
            best.append(f"{values[i]:.3f} ({steps[i]})")
        rows += [final, best]
    return header, rows


# ---------------------------------------------------------------- show


def rollout_groups(path: Path, step: int | None) -> tuple[int, list[list[dict]]]:
    """The logged completions of one step (default: the last logged), grouped by prompt in logged order."""
    rollouts = path / "rollouts.jsonl"
    if not rollouts.is_file():
        raise UserError(f"{path}: no rollouts.jsonl (is it a run directory? was log.rollouts_every=0?)")
    rows = read_jsonl(rollouts)
    steps = sorted({r["step"] for r in rows})
    if not steps:
        raise UserError(f"{rollouts} is empty")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"--step {step}: not logged in {rollouts}; logged steps: {_ranges(steps)}")
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["step"] == step:
            groups.setdefault(str(r["prompt_id"]), []).append(r)
    return step, list(groups.values())


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, start = [], steps[0]
    for a, b in zip(steps, steps[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return ", ".join(out)
