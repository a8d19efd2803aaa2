"""Thinking Seeds vs GRPO at equal steps on the built-in task: entropy, answer diversity, accuracy.

    python bench/seeds_compare.py --run --seeds 0 1 2 --dir runs/seeds-compare   # trains and evaluates (slow)
    python bench/seeds_compare.py --dir runs/seeds-compare                       # summarises existing runs

Each pair of runs uses the default (calibrated) configuration and the same seed; the seeded run is
`--method thinking_seeds -o method.host=grpo -o method.aggregation=seq-mean-token-mean -o seeds.every=10`,
so apart from the seeding (and the prefix-ratio cap, which only touches prefix tokens) its loss is grpo's.
Per run it reports the mean over steps of the policy entropy and of the distinct extracted answers per group,
the mean reward, and the greedy accuracy on 200 held-out problems after training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ARMS = {
    "grpo": ["--method", "grpo"],
    "seeds": [
        "--method",
        "thinking_seeds",
        "-o",
        "method.host=grpo",
        "-o",
        "method.aggregation=seq-mean-token-mean",
        "-o",
        "seeds.every=10",
    ],
}


def train_and_eval(root: Path, arm: str, seed: int) -> None:
    out = root / f"{arm}-s{seed}"
    if (out / "eval-after" / "summary.json").is_file():
        return
    thinkrl = [sys.executable, "-m", "thinkrl"]
    subprocess.run([*thinkrl, "train", *ARMS[arm], "-o", f"train.seed={seed}", "--output-dir", str(out)], check=True)
    subprocess.run(
        [*thinkrl, "eval", "--model", str(out), "--limit", "200", "--max-new-tokens", "48", "--output", str(out / "eval-after")], check=True
    )


def summarise(run: Path) -> dict:
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    mean = lambda k: statistics.fmean(m[k] for m in metrics if k in m)  # noqa: E731
    out = {
        "steps": len(metrics),
        "entropy": mean("entropy"),
        "entropy_last10": statistics.fmean(m["entropy"] for m in metrics[-10:]),
        "distinct": mean("answers/distinct_per_group"),
        "reward": mean("reward/mean"),
        "step_s": mean("time/step"),
    }
    summary = run / "eval-after" / "summary.json"
    if summary.is_file():
        out["accuracy"] = json.loads(summary.read_text())["metrics"]["avg@1"]
    if any("reward/seeded_mean" in m for m in metrics):
        out["reward_seeded"] = mean("reward/seeded_mean")
        out["reward_unseeded"] = mean("reward/unseeded_mean")
        out["seeded_frac"] = mean("seeds/seeded_frac")
    return out


def table(root: Path) -> str:
    rows = [
        "| run | steps | entropy (mean) | entropy (last 10) | distinct answers / group | reward | held-out acc | s/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_arm: dict[str, list[dict]] = {}
    for run in sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file()):
        s = summarise(run)
        by_arm.setdefault(run.name.split("-s")[0], []).append(s)
        acc = f"{s['accuracy']:.1%}" if "accuracy" in s else "-"
        rows.append(
            f"| {run.name} | {s['steps']} | {s['entropy']:.3f} | {s['entropy_last10']:.3f} | {s['distinct']:.2f} | "
            f"{s['reward']:.3f} | {acc} | {s['step_s']:.1f} |"
        )
    for arm, runs in by_arm.items():
        m = lambda k, runs=runs: statistics.fmean(r[k] for r in runs if k in r)  # noqa: E731
        acc = f"{m('accuracy'):.1%}" if all("accuracy" in r for r in runs) else "-"
        rows.append(
            f"| **{arm} mean of {len(runs)}** | | {m('entropy'):.3f} | {m('entropy_last10'):.3f} | {m('distinct'):.2f} | "
            f"{m('reward'):.3f} | {acc} | {m('step_s'):.1f} |"
        )
    seeded = [r for r in by_arm.get("seeds", []) if "reward_seeded" in r]
    if seeded:
        rows += [
            "",
            f"Seeded runs: {statistics.fmean(r['seeded_frac'] for r in seeded):.0%} of completions seeded on average; mean reward "
            f"of seeded completions {statistics.fmean(r['reward_seeded'] for r in seeded):.3f} vs unseeded "
            f"{statistics.fmean(r['reward_unseeded'] for r in seeded):.3f}.",
        ]
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="runs/seeds-compare")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--run", action="store_true", help="train and evaluate the missing runs first")
    a = p.parse_args()
    root = Path(a.dir)
    if a.run:
        for seed in a.seeds:
            for arm in ARMS:
                train_and_eval(root, arm, seed)
    print(table(root))


if __name__ == "__main__":
    main()
