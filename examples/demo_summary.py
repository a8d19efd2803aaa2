"""Print what `make demo` measured: held-out accuracy before and after training, and the training time.

usage: python examples/demo_summary.py RUN_DIR   (RUN_DIR holds eval-before/, eval-after/, metrics.jsonl)
"""

import json
import sys
from pathlib import Path


def main(run_dir: Path) -> None:
    before = json.loads((run_dir / "eval-before" / "summary.json").read_text())
    after = json.loads((run_dir / "eval-after" / "summary.json").read_text())
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
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


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/demo"))
