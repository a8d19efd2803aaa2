"""Generation engines on the CPU: tokens/s and peak memory per engine and budget (writes bench/RESULTS-engines.md).

Every measurement runs in a fresh process: the bundled SmolLM2-135M-Instruct in float32, arithmetic prompts
from the built-in task, 64 slots (rollout.batch_size), one warm-up call, then one timed call.

    spread    a reasoning-like length spread: no end-of-sequence, each completion runs to its own length;
              80% of them 16-128 tokens, 15% log-uniform up to the budget, 5% (at least one) at the budget
    short     answers of 30-50 tokens (each ends at its own length) under the budget: the memory check
              "budget 8,192 with short answers costs no more than budget 64"
    fixed     every completion exactly the budget (no end-of-sequence id): the per-token speed of a full batch

    python bench/engines.py                                   # the table in bench/RESULTS-engines.md
    python bench/engines.py --engines lean --budgets 64 --groups 8 --modes fixed --old-checkout /tmp/old
    (--old-checkout: a checkout of commit aeb641f, whose static decoder is timed on the same `fixed` workload)

vLLM runs where it imports (the venv of `make test-vllm`: `.venv-vllm/bin/python bench/engines.py --engines vllm`);
its rows are then appended to the same file by hand-merging the printed table.
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
sys.path.insert(0, str(ROOT / "bench"))
import machine  # noqa: E402  (bench/machine.py)


def lengths(budget: int, n: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = i / n
        if r < 0.05:
            out.append(budget)  # the tail at the budget
        elif r < 0.20:
            out.append(int(round(min(budget, 128) * (budget / min(budget, 128)) ** rng.random())))
        else:
            out.append(rng.randint(min(16, budget), min(128, budget)))
    rng.shuffle(out)
    return out


def _mem_reset() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set
    except OSError:
        pass


def _mem(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # MB
    return float("nan")


def one(engine_name: str, budget: int, group: int, mode: str, old: bool) -> dict:
    """One timed generation in this process."""
    import torch

    from thinkrl.config import DataConfig, PromptConfig
    from thinkrl.data import build_prompts, load_problems
    from thinkrl.models import load_base, resolve_path

    torch.manual_seed(0)
    model, tok = load_base("smollm2-135m", torch.float32)
    model.eval().requires_grad_(False)
    prompts_n = max(1, 128 // group) if mode == "spread" and budget == 2048 else (2 if group == 8 else 1)
    problems = load_problems(DataConfig(limit=prompts_n)).problems
    prompts = [p.ids for p in build_prompts(problems, tok, PromptConfig(), 512)[0]]
    R = len(prompts) * group
    eos: list[int] = []  # each completion ends at its own budget (spread, short) or at the budget (fixed)
    budgets = lengths(budget, R) if mode == "spread" else [30 + (7 * i) % 21 for i in range(R)] if mode == "short" else None
    if old:  # the static decoder of the checkout on PYTHONPATH (commit aeb641f)
        from thinkrl.rollout import Sampling, generate

        def call(sampling, gen):
            return generate(model, prompts, group, sampling, eos, tok.pad_token_id, gen), {}
    else:
        from thinkrl.rollout.completions import Request, Sampling
        from thinkrl.rollout.engines import make_engine

        engine = make_engine(engine_name, torch.device("cpu"), 64, budget, model_path=resolve_path("smollm2-135m"))

        def call(sampling, gen):
            comp = engine.generate(model, Request(prompts, group, sampling, eos, tok.pad_token_id, gen, budgets=budgets))
            return comp, dict(engine.stats)

    warm = Sampling(8, 1.0)
    call(warm, torch.Generator().manual_seed(1))
    sampling = Sampling(budget, 1.0)
    rss_before = _mem("VmRSS")
    _mem_reset()
    t0 = time.perf_counter()
    comp, stats = call(sampling, torch.Generator().manual_seed(2))
    seconds = time.perf_counter() - t0
    tokens = int(comp.lengths.sum())
    return {
        "engine": "lean (old static decoder)" if old else engine_name,
        "mode": mode,
        "budget": budget,
        "group": group,
        "requests": R,
        "tokens": tokens,
        "longest": int(comp.lengths.max()),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "ms_per_token": 1000 * seconds / tokens,
        "rss_before_mb": rss_before,
        "peak_rss_mb": _mem("VmHWM"),
        **{k.removeprefix("generate/"): v for k, v in stats.items()},
    }


def run_one(python: str, args: list[str], env: dict) -> dict | None:
    proc = subprocess.run([python, __file__, "--one", *args], capture_output=True, text=True, env=env, timeout=7200)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode or line is None:
        print(f"failed: {args}: {proc.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(line)


def table(rows: list[dict]) -> list[str]:
    out = [
        "| engine | mode | budget | group | requests | tokens | longest | seconds | tokens/s | ms/token | peak RSS (MB) "
        "| RSS before (MB) | slot utilisation | KV storage (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        util = f"{r['slot_utilisation']:.3f}" if "slot_utilisation" in r else "-"
        kv = f"{r['kv_mb']:.0f}" if "kv_mb" in r else "-"
        out.append(
            f"| {r['engine']} | {r['mode']} | {r['budget']} | {r['group']} | {r['requests']} | {r['tokens']} | {r['longest']} "
            f"| {r['seconds']:.1f} | {r['tokens_per_s']:.0f} | {r['ms_per_token']:.2f} | {r['peak_rss_mb']:.0f} "
            f"| {r['rss_before_mb']:.0f} | {util} | {kv} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=5, metavar=("ENGINE", "BUDGET", "GROUP", "MODE", "OLD"), help=argparse.SUPPRESS)
    ap.add_argument("--engines", default="lean,transformers")
    ap.add_argument("--budgets", default="64,512,2048,8192")
    ap.add_argument("--groups", default="8,64")
    ap.add_argument("--modes", default="spread,short,fixed")
    ap.add_argument("--old-checkout", type=Path, help="a checkout of commit aeb641f: time its static decoder on `fixed`")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS-engines.md")
    a = ap.parse_args()
    if a.one:
        engine, budget, group, mode, old = a.one
        print(json.dumps(one(engine, int(budget), int(group), mode, old == "1")))
        return
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    rows = []
    for mode in a.modes.split(","):
        budgets = [int(b) for b in a.budgets.split(",")]
        if mode == "short":
            budgets = [b for b in budgets if b in (64, 8192)] or budgets
        if mode == "fixed":
            budgets = budgets[:1]
        for budget in budgets:
            for group in [int(g) for g in a.groups.split(",")]:
                for engine in a.engines.split(","):
                    result = run_one(sys.executable, [engine, str(budget), str(group), mode, "0"], env)
                    if result:
                        rows.append(result)
                        print(table([result])[-1], flush=True)
                if a.old_checkout and mode == "fixed":
                    old_env = {**env, "PYTHONPATH": str(a.old_checkout)}
                    result = run_one(sys.executable, ["lean", str(budget), str(group), mode, "1"], old_env)
                    if result:
                        rows.append(result)
                        print(table([result])[-1], flush=True)
    command = f"python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}"
    text = [
        "# Generation engines on the CPU",
        "",
        f"Machine: {machine.describe(machine.machine(env))}.",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, fresh process per row).",
        "SmolLM2-135M-Instruct in float32, 64 slots, one warm-up call, then one timed call. Modes: see the script's docstring.",
        "",
        *table(rows),
        "",
    ]
    a.out.write_text("\n".join(text))
    print(f"written: {a.out}")


if __name__ == "__main__":
    main()
