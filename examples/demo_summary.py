"""Print what `make demo` measured: held-out accuracy before and after training, and the time it took.

usage: python examples/demo_summary.py RUN_DIR [--seconds S]

RUN_DIR is the demo's run: eval/step-0/<dataset>/ holds the starting model's evaluation, eval/step-N/<dataset>/
the trained one's (N: the last step), metrics.jsonl the training steps. --seconds: the whole demo's wall time.
"""

import argparse
import json
from pathlib import Path


def evaluation(run_dir: Path, step: int) -> dict:
    found = sorted((run_dir / "eval" / f"step-{step}").glob("*/summary.json"))
    if not found:
        raise SystemExit(f"error: no evaluation in {run_dir}/eval/step-{step}/; run `make demo` again")
    return json.loads(found[0].read_text())


def main(run_dir: Path, seconds: float | None) -> None:
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    before, after = evaluation(run_dir, 0), evaluation(run_dir, steps[-1]["step"])
    key = next(k for k in before["metrics"] if k.startswith("avg@"))
    b, a = before["metrics"][key], after["metrics"][key]
    train_s = sum(m["time/step"] for m in steps)
    change = f"{b:.1%} before -> {a:.1%} after ({(a - b) * 100:+.1f} points)"
    print(f"held-out {before['dataset']} ({before['problems']} problems, greedy): {change}")
    print(
        f"training: {len(steps)} steps in {train_s / 60:.1f} min ({train_s / len(steps):.1f} s/step); "
        f"train reward {steps[0]['reward/mean']:.3f} at step 1 -> "
        f"{sum(m['reward/mean'] for m in steps[-5:]) / min(5, len(steps)):.3f} over the last 5 steps"
    )
    if seconds is not None:
        print(f"the whole demo (two evaluations and the training): {seconds / 60:.1f} min")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?", default=Path("runs/demo"))
    parser.add_argument("--seconds", type=float, help="the whole demo's wall time")
    args = parser.parse_args()
    main(args.run_dir, args.seconds)
