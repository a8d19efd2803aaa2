"""The GPU check of the engines (run by bench/gpu.sh on one GPU; `--small` runs the same code on a CPU in a minute).

1. decode speed: each engine (lean, transformers) on the random Qwen2.5-1.5B-shaped model (bench/random_model.py)
   in bf16, 64 and 256 rows, prompts of 3,584 tokens and 512 new tokens each (decode at about 4k tokens of
   context), against the bandwidth floor: a decode step must read every weight and every live key and value once;
2. one full training step (`thinkrl train`, LoRA r=16, 2 x 8 completions of up to 512 tokens, lean engine);
3. one eval batch (`thinkrl eval`, 16 problems x 4 samples of up to 512 tokens, each engine).
Writes OUT/gpu.json and OUT/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def bandwidth(device: str) -> float:
    """Device copy bandwidth in bytes/s, counting bytes read and written (1 GiB copied 10 times)."""
    x = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    if device == "cuda":
        torch.cuda.synchronize()
    return 10 * 2 * x.numel() * x.element_size() / (time.perf_counter() - t0)


def decode(engine_name: str, model, rows: int, context: int, new: int, bw: float) -> dict:
    from thinkrl.rollout.completions import Request, Sampling
    from thinkrl.rollout.engines import make_engine

    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    top = min(40000, model.config.vocab_size)
    prompts = [torch.randint(10, top, (context - new,), generator=g).tolist() for _ in range(rows)]
    engine = make_engine(engine_name, device, rows, new, model_path=model.config._name_or_path)
    budgets = [new] * rows  # no end-of-sequence: every row decodes exactly `new` tokens
    engine.generate(model, Request(prompts[:2], 1, Sampling(8, 1.0), [], 0, torch.Generator().manual_seed(1)))  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    comp = engine.generate(model, Request(prompts, 1, Sampling(new, 1.0), [], 0, torch.Generator().manual_seed(2), budgets=budgets))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = int(comp.lengths.sum())
    c = model.config
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 2  # bf16
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    mean_context = context - new / 2
    floor_step = (weights + rows * mean_context * kv_per_token) / bw  # seconds per decode step at the bandwidth
    return {
        "engine": engine_name,
        "rows": rows,
        "context": context,
        "new_tokens": new,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "floor_tokens_per_s": rows / floor_step,
        "fraction_of_floor": (tokens / seconds) / (rows / floor_step),
        "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        **{k.removeprefix("generate/"): v for k, v in engine.stats.items()},
    }


def cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "thinkrl", *args], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", action="store_true", help="CPU smoke run: the tiny shapes, so the script's code is tested")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    from random_model import NAME, model_dir
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() and not a.small else "cpu"
    if a.small:  # the tiny test model
        sys.path.insert(0, str(HERE.parent / "tests"))
        from tiny import build_tiny_model

        path = str(build_tiny_model(a.out / "tiny", heads=2, head_dim=32))
    else:
        path = model_dir(NAME)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval().requires_grad_(False)
    bw = bandwidth(device)
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "bandwidth_gb_s": bw / 1e9, "decode": []}
    shapes = [(64, 4096, 512), (256, 4096, 512)] if not a.small else [(4, 64, 16)]
    for engine in ("lean", "transformers"):
        for rows, context, new in shapes:
            r = decode(engine, model, rows, context, new, bw)
            results["decode"].append(r)
            print(json.dumps(r), flush=True)
    del model
    run = a.out / "run"
    new = "512" if not a.small else "8"
    steps = ["-o", "train.steps=1", "-o", "rollout.group_size=8", "-o", "rollout.prompts_per_step=2", "-o", f"rollout.max_new_tokens={new}"]
    results["train_step_seconds"] = cli(["train", "--model", path, "--output-dir", str(run), *steps])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    results["train_step"] = {k: metrics[-1][k] for k in ("time/step", "time/generate", "time/update", "tokens/s", "length/mean")}
    for engine in ("lean", "transformers"):
        out = a.out / f"eval-{engine}"
        limit = "16" if not a.small else "2"
        args = [
            "eval",
            "--model",
            str(run),
            "--limit",
            limit,
            "--n",
            "4",
            "--max-new-tokens",
            new,
            "--engine",
            engine,
            "--output",
            str(out),
        ]
        results[f"eval_{engine}_seconds"] = cli(args)
    (a.out / "gpu.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"# GPU check: {results['device']}, copy bandwidth {results['bandwidth_gb_s']:.0f} GB/s",
        "",
        "| engine | rows | context | tokens/s | floor tokens/s | fraction of floor | peak GPU GB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["decode"]:
        peak = f"{r['peak_gpu_gb']:.1f}" if r["peak_gpu_gb"] is not None else "-"
        lines.append(
            f"| {r['engine']} | {r['rows']} | {r['context']} | {r['tokens_per_s']:.0f} | {r['floor_tokens_per_s']:.0f} "
            f"| {r['fraction_of_floor']:.2f} | {peak} |"
        )
    lines += ["", f"train step: {results['train_step']}", ""]
    lines += [f"eval ({e}): {results[f'eval_{e}_seconds']:.1f} s" for e in ("lean", "transformers")]
    (a.out / "gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
