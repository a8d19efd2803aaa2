"""Do the engines train alike? The demo settings (`thinkrl train` defaults: bundled SmolLM2-135M, LoRA, built-in
arithmetic, grpo, 40 steps) once per engine and seed, each run evaluated on the same 200 held-out problems
with greedy decoding by the lean engine; and `thinkrl eval --engine X` of the untrained model on 20 problems,
whose greedy answers must match lean's. Appends a table to bench/RESULTS-engines-learning.md.

    python bench/engines_learn.py --engines lean,transformers --seeds 0,1
    .venv-vllm/bin/python bench/engines_learn.py --engines vllm --seeds 0,1      (vLLM's venv: make test-vllm)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def thinkrl(*args: str) -> None:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-m", "thinkrl", *args], check=True, env=env, cwd=ROOT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="lean,transformers")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "engines")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS-engines-learning.md")
    a = ap.parse_args()
    rows = []
    for engine in a.engines.split(","):
        greedy = a.runs / f"greedy-{engine}"
        if not (greedy / "summary.json").is_file():
            thinkrl("eval", "--model", "smollm2-135m", "--limit", "20", "--engine", engine, "--output", str(greedy))
        for seed in a.seeds.split(","):
            run = a.runs / f"{engine}-{seed}"
            if not (run / "checkpoints").is_dir():
                t0 = time.perf_counter()
                thinkrl("train", "--output-dir", str(run), "-o", f"rollout.engine={engine}", "-o", f"train.seed={seed}")
                (run / "wall_seconds.txt").write_text(f"{time.perf_counter() - t0:.0f}\n")
            held = run / "eval-heldout"
            if not (held / "summary.json").is_file():
                thinkrl("eval", "--model", str(run), "--limit", "200", "--engine", "lean", "--output", str(held))
            metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            summary = json.loads((held / "summary.json").read_text())["metrics"]
            gen = sum(m["time/generate"] for m in metrics) / len(metrics)
            rows.append(
                (
                    engine,
                    seed,
                    summary["avg@1"],
                    summary["avg@1_ci95_low"],
                    summary["avg@1_ci95_high"],
                    sum(m["reward/mean"] for m in metrics[-5:]) / 5,
                    gen,
                    (run / "wall_seconds.txt").read_text().strip(),
                )
            )
    lean_answers = a.runs / "greedy-lean" / "samples.jsonl"
    agree = {}
    if lean_answers.is_file():
        ref = {r["id"]: r["completion"] for r in map(json.loads, lean_answers.read_text().splitlines())}
        for engine in a.engines.split(","):
            got = {
                r["id"]: r["completion"] for r in map(json.loads, (a.runs / f"greedy-{engine}" / "samples.jsonl").read_text().splitlines())
            }
            agree[engine] = sum(got[i] == ref[i] for i in ref)
    lines = [
        "",
        f"Command: `python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| engine | seed | held-out greedy accuracy (200 problems) | 95% interval | train reward, last 5 steps "
        "| generate s/step | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, seed, acc, lo, hi, reward, gen, wall in rows:
        lines.append(f"| {engine} | {seed} | {acc:.3f} | {lo:.3f}-{hi:.3f} | {reward:.3f} | {gen:.1f} | {wall} |")
    if agree:
        lines += ["", "Greedy `thinkrl eval --engine X` of the untrained model, 20 problems: completions equal to lean's:"]
        lines += [f"- {engine}: {n} of 20" for engine, n in agree.items()]
    if not a.out.exists():
        a.out.write_text(
            "# Do the engines train alike?\n\nDemo settings (thinkrl train defaults, 40 steps) per engine and seed; every run's "
            "held-out accuracy measured the same way (lean, greedy, 200 problems of the arithmetic test split).\n"
        )
    with a.out.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
