"""bench_trl.py's tables: one setting for both trainers (`report`), thinkrl over lengths and groups (`scaling`).
The measurements come from bench_trl.py's workers; these functions only lay them out."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import machine
import roofline

NOTES = """Notes. Each run is a fresh subprocess (its own peak RSS); the driver alternates thinkrl and TRL, and every run
does its warm-up steps before the timed ones. TRL runs `GRPOTrainer` without vLLM with
`per_device_train_batch_size` = prompts x group, `num_generations` = group and `min_new_tokens` = max_new_tokens
(fixed length); its default gradient checkpointing is left as TRL ships it. thinkrl grades in worker
processes: one worker's own peak (VmHWM after grading 200 answers) is in its own column, and the default pool
has two. TRL grades in-process. On a shared 2-core virtual machine step times drift by 10-20% between
minutes, which is why runs alternate and the ratio is taken over medians of the same bench run."""


def scaling(a, worker, summarise) -> None:
    """Step time and peak memory of thinkrl's training pass as completions get longer and groups larger."""
    grid = [(64, 8), (256, 8), (1024, 8), (256, 4), (256, 16)]
    lines = [
        "| new tokens | group | tokens per step | median step (s) | generate (s) | logp + update (s) "
        "| update s per 1k tokens | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for T, G in grid:
        print(f"scaling: {T} tokens x {G} ...", flush=True)
        r = worker(
            "thinkrl",
            [
                "--model",
                a.model,
                "--prompts",
                str(a.prompts),
                "--group",
                str(G),
                "--max-new-tokens",
                str(T),
                "--steps",
                str(a.steps),
                "--warmup",
                str(a.warmup),
                "--micro-batch",
                str(a.micro_batch),
            ],
        )
        if "error" in r:
            lines.append(f"| {T} | {G} | | failed: {r['error']} | | | | |")
            continue
        s = summarise([r])
        lines.append(
            f"| {T} | {G} | {s['tokens']:.0f} | {s['step_s']:.1f} | {s['generate_s']:.1f} | {s['update_s']:.1f} | "
            f"{1000 * s['update_s'] / s['tokens']:.2f} | {s['peak_mb']:.0f} |"
        )
    m = machine.machine()
    text = (
        "\n".join(
            [
                f"# thinkrl scaling (training pass; {machine.label(m)})",
                "",
                f"Machine: {machine.describe(m)}.",
                f"Command: `python bench/bench_trl.py {' '.join(sys.argv[1:])}`.",
                "",
                *lines,
            ]
        )
        + "\n"
    )
    Path(a.out).write_text(text)
    print(text)


def _env_prefix() -> str:
    """Allocator settings that change peak memory, as they were set for this run."""
    keys = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")
    return "".join(f"{k}={os.environ[k]} " for k in keys if os.environ.get(k))


def report(a, runs: dict[str, list[dict]], settings, summarise) -> None:
    import torch

    from thinkrl.models import load_base

    model, _ = load_base(a.model, torch.float32)
    params = sum(p.numel() for p in model.parameters())
    stats = {t: summarise(r) for t, r in runs.items()}
    errors = {t: [r["error"] for r in rs if "error" in r] for t, rs in runs.items()}
    m = machine.machine()
    device = f"{torch.cuda.get_device_name()}; host {machine.describe(m)}" if torch.cuda.is_available() else machine.describe(m)
    lines = [
        f"# thinkrl vs TRL GRPOTrainer ({machine.label(m)})",
        "",
        f"Machine: {device}; python {platform.python_version()}.",
        f"Settings: {json.dumps(settings(a))}.",
        f"Command: `{_env_prefix()}python bench/bench_trl.py {' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| trainer | CPU (ISA) | median step (s) | generate (s) | score (s) | logp + update (s) | tokens/s | peak memory (MB) "
        "| verifier worker (MB each) | steps timed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    cpu = f"{m['cpu']} ({m['torch_capability']}, {machine.label(m)})"  # a ratio means little without the CPU it ran on
    for t, s in stats.items():
        if s is None:
            lines.append(f"| {t} | {cpu} | failed: {errors[t][0] if errors[t] else '?'} | | | | | | | 0 |")
            continue
        workers = f"{s['children_peak_mb']:.0f}" if s["children_peak_mb"] else "in-process"
        lines.append(
            f"| {t} | {cpu} | {s['step_s']:.2f} | {s['generate_s']:.2f} | {s['score_s']:.2f} | {s['update_s']:.2f} | "
            f"{s['tokens'] / s['step_s']:.0f} | {s['peak_mb']:.0f} | {workers} | {s['n']} |"
        )
    if stats.get("thinkrl") and stats.get("trl"):
        ours, theirs = stats["thinkrl"], stats["trl"]
        lines += [
            "",
            f"thinkrl step time / TRL step time: **{ours['step_s'] / theirs['step_s']:.2f}x**; "
            f"peak memory ratio {ours['peak_mb'] / theirs['peak_mb']:.2f}x.",
        ]
    if stats.get("thinkrl"):
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        gflops, gbs = roofline.peak_gflops(dtype), roofline.bandwidth_gbs()
        weight_bytes = params * torch.finfo(dtype).bits // 8
        floor = roofline.step_floor(
            a.prompts, a.group, a.max_new_tokens, roofline.prompt_tokens(a.model), params, weight_bytes, gflops, gbs
        )
        lines += ["", roofline.describe(floor, gflops, gbs, {t: s["step_s"] for t, s in stats.items() if s})]
    lines += ["", NOTES]
    text = "\n".join(lines) + "\n"
    Path(a.out).write_text(text)
    print(text)
