"""bench_trl.py --lengths 64,256,1024: both trainers at each completion length, in one run, one table.

Each (length, trainer) pair is measured in fresh subprocesses, alternating thinkrl and TRL. The shortest
length runs the given --warmup/--steps/--rounds; longer ones run one timed step without warm-up, once per
trainer (TRL's 1,024-token step takes about 8 minutes on 2 cores), which the table says. The roofline floor
of each length is computed from this machine's measured matmul peak and copy bandwidth (roofline.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import machine
import roofline


def plan(a, length: int, shortest: int) -> tuple[int, int, int]:
    """(warmup, steps, rounds) at this length."""
    return (a.warmup, a.steps, a.rounds) if length == shortest else (0, 1, 1)


def run(a, worker, summarise) -> None:
    lengths = sorted(int(x) for x in a.lengths.split(","))
    trainers = [a.only] if a.only else ["thinkrl", "trl"]
    args = ["--model", a.model, "--prompts", str(a.prompts), "--group", str(a.group), "--micro-batch", str(a.micro_batch)]
    results: dict[tuple[int, str], dict | None] = {}
    for T in lengths:
        warmup, steps, rounds = plan(a, T, lengths[0])
        runs: dict[str, list[dict]] = {t: [] for t in trainers}
        for r in range(rounds):
            for t in trainers:
                print(f"{T} tokens, round {r + 1}/{rounds}: {t} ...", flush=True)
                t0 = time.perf_counter()
                extra = ["--max-new-tokens", str(T), "--warmup", str(warmup), "--steps", str(steps)]
                runs[t].append(worker(t, [*args, *extra]))
                print(f"  {runs[t][-1].get('error', 'done')} ({time.perf_counter() - t0:.0f} s)", flush=True)
        for t in trainers:
            results[(T, t)] = summarise(runs[t])
    write(a, lengths, trainers, results)


def _ratio(ours: dict, theirs: dict | None, key: str) -> str:
    return f"{ours[key] / theirs[key]:.2f}x" if theirs else ""


def write(a, lengths: list[int], trainers: list[str], results: dict) -> None:
    import torch

    from thinkrl.models import load_base

    model, _ = load_base(a.model, torch.float32)
    params = sum(p.numel() for p in model.parameters())
    gflops, gbs = roofline.peak_gflops(torch.float32), roofline.bandwidth_gbs()
    prompt_len = roofline.prompt_tokens(a.model)
    m = machine.machine()
    cpu = f"{m['cpu']} ({m['torch_capability']}, {machine.label(m)})"  # a ratio means little without the CPU it ran on
    lines = [
        "| new tokens | trainer | CPU (ISA) | steps timed | median step (s) | generate (s) | logp + update (s) | peak RSS (MB) "
        "| step vs TRL | RSS vs TRL | roofline floor (s) | of floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for T in lengths:
        floor = roofline.step_floor(a.prompts, a.group, T, prompt_len, params, params * 4, gflops, gbs)["total_s"]
        theirs = results.get((T, "trl"))
        for t in trainers:
            s = results[(T, t)]
            if s is None:
                lines.append(f"| {T} | {t} | {cpu} | 0 | failed | | | | | | | |")
                continue
            step_vs, rss_vs = (_ratio(s, theirs, k) if t != "trl" else "" for k in ("step_s", "peak_mb"))
            lines.append(
                f"| {T} | {t} | {cpu} | {s['n']} | {s['step_s']:.2f} | {s['generate_s']:.2f} | {s['update_s']:.2f} | {s['peak_mb']:.0f} "
                f"| {step_vs} | {rss_vs} | {floor:.2f} | {floor / s['step_s']:.0%} |"
            )
    text = "\n".join(
        [
            f"# thinkrl vs TRL GRPOTrainer by completion length ({machine.label(m)})",
            "",
            f"Machine: {machine.describe(m)}.",
            f"Command: `python bench/bench_trl.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}); "
            f"{a.prompts} prompts x {a.group} completions per step, fixed-length completions, both trainers on their "
            "default memory settings.",
            f"Timed steps: {a.warmup} warm-up then {a.steps} timed per run, {a.rounds} run(s) per trainer at "
            f"{lengths[0]} tokens; one step without warm-up, one run per trainer, at longer lengths.",
            f"Roofline (roofline.py): this machine measured {gflops:.0f} GFLOP/s (fp32 matmul) and {gbs:.1f} GB/s "
            "(copy); the floor is decode at the bandwidth limit plus prefill and the training pass (4N FLOPs per "
            "completion token) at the matmul peak; 'of floor' is floor / median step.",
            "",
            *lines,
            "",
        ]
    )
    Path(a.out).write_text(text)
    print(text)
