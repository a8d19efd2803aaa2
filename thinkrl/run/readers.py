"""Reading run directories after (or during) training: `thinkrl compare`, `thinkrl show`, and the data of
`thinkrl plot`. Everything here reads metrics.jsonl, rollouts.jsonl and config.yaml; nothing writes."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
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
    config: dict = field(default_factory=dict)  # config.yaml as written ({} without one)

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
        runs.append(Run(path, method, method, metrics, config or {}))
    # distinct labels: the method, then its directory's name, its path, and last a number (one path twice)
    for name in (lambda r: f"{r.method} ({r.path.name})", lambda r: f"{r.method} ({r.path})"):
        counts = Counter(r.label for r in runs)
        for r in runs:
            if counts[r.label] > 1:
                r.label = name(r)
    counts, seen = Counter(r.label for r in runs), Counter()
    for r in runs:
        if counts[r.label] > 1:
            seen[r.label] += 1
            r.label = f"{r.label} #{seen[r.label]}"
    return runs


def _flat(config: dict, prefix: str = "") -> dict[str, object]:
    """{'train': {'seed': 1}} -> {'train.seed': 1}."""
    out: dict[str, object] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _settings(run: Run) -> dict[str, object]:
    """A run's config without what differs between repeats of one experiment: train.seed and output_dir."""
    return {k: v for k, v in _flat(run.config).items() if k not in ("train.seed", "output_dir")}


def seed_groups(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """(label, runs) per line of a plot, in the order given. Runs whose config.yaml differ only in train.seed
    (and output_dir), two or more with distinct seeds, form one group, labelled with the method and the number
    of seeds (plus the settings that tell it from another group of the same method); every other run is
    its own group, with its own label."""
    by_settings: dict[str, list[Run]] = {}
    for r in runs:
        key = json.dumps(_settings(r), sort_keys=True, default=str) if r.config else str(id(r))
        by_settings.setdefault(key, []).append(r)
    groups = []
    for members in by_settings.values():
        seeds = [_flat(r.config).get("train.seed") for r in members]
        if len(members) > 1 and len(set(map(str, seeds))) == len(members):
            groups.append(members)
        else:
            groups += [[r] for r in members]
    groups.sort(key=lambda g: runs.index(g[0]))
    base = [g[0].label if len(g) == 1 else f"{g[0].method} ({len(g)} seeds: mean, min-max band)" for g in groups]
    labels = list(base)
    for i, g in enumerate(groups):
        same = [h for j, h in enumerate(groups) if len(h) > 1 and base[j] == base[i]]
        if len(g) > 1 and len(same) > 1:  # two seed groups of one method: name what differs
            flats = [_settings(h[0]) for h in same]
            mine = _settings(g[0])
            differ = [k for k in dict.fromkeys(k for f in flats for k in f) if len({str(f.get(k)) for f in flats}) > 1]
            labels[i] = labels[i].replace(" (", " " + ", ".join(f"{k}={mine.get(k)}" for k in differ[:3]) + " (", 1)
    return list(zip(labels, groups))


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


def rollout_answer(row: dict) -> str | None:
    """A logged completion's final answer: the content of its last \\boxed{} (thinkrl.verifier.extract_boxed, a
    linear scan that parses nothing: the text is model output). The verifier's unboxed fallback, math-verify's
    extraction from the completion's tail, is not redone here (it runs only in the verifier's workers)."""
    from thinkrl.verifier import extract_boxed

    return row["extracted"] if "extracted" in row else extract_boxed(row["completion"])


def print_rollouts(path: Path, step: int | None, groups: int, max_chars: int) -> None:
    """`thinkrl show`: a step's completions with reward, advantage and answer, `groups` prompt groups (0 = all),
    each completion cut to `max_chars` (0 = whole). Logged text is printed as text (escapes shown, not obeyed)."""
    from thinkrl.run.console import console, shown

    step, found = rollout_groups(path, step)
    console.print(f"[bold]{shown(path)}[/] step {step}: {len(found)} groups")
    for group in found[: groups or None]:
        first = group[0]
        console.rule(f"prompt {shown(first['prompt_id'])}  (answer: {shown(first['answer'])})")
        console.print(shown(first["prompt"]))
        for i, r in enumerate(group):
            text = r["completion"] if not max_chars or len(r["completion"]) <= max_chars else r["completion"][:max_chars] + " [...]"
            color = "green" if r["score"] > 0 else "red"
            extra = f", prefix {shown(r['prefix_len'])} tokens from step {shown(r['seed_step'])}" if r.get("prefix_len") else ""
            answer = rollout_answer(r)
            said = "none" if answer is None else shown(answer if len(answer) <= 80 else answer[:80] + " [...]")
            console.print(
                f"\n[{color}]#{i} reward {r['reward']:+.2f}  advantage {r['advantage']:+.2f}  {shown(r['length'])} tokens"
                f"{' (truncated)' if r['truncated'] else ''}{extra}[/]  answer: {said}"
            )
            console.print(shown(text))


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, start = [], steps[0]
    for a, b in zip(steps, steps[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return ", ".join(out)
