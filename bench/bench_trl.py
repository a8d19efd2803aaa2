"""thinkrl vs TRL's GRPOTrainer at equal settings: step time, phases, tokens/s, peak memory, roofline.

    pip install -e ".[bench]"                 # adds trl
    python bench/bench_trl.py --lengths 64,256,1024   # both trainers at three lengths; writes bench/RESULTS.md
    python bench/bench_trl.py                 # 16 x 64 tokens alone
    python bench/bench_trl.py --max-new-tokens 1024 --group 16 --prompts 1 --steps 1 --warmup 0 --rounds 1 --out bench/RESULTS-1024.md
    python bench/bench_trl.py --scaling --steps 1 --warmup 0 --out bench/RESULTS-scaling.md       # thinkrl only
    python bench/bench_trl.py --model random-qwen2.5-1.5b --max-new-tokens 512 --out bench/RESULTS-gpu-512.md    # GPU
    python bench/bench_trl.py --model random-qwen2.5-1.5b --max-new-tokens 4096 --prompts 1 --out bench/RESULTS-gpu-4096.md
    python bench/bench_trl.py --isa both      # native, then every process held at AVX2: RESULTS.md and RESULTS-avx2.md

Both trainers get the same model (SmolLM2-135M-Instruct, the bundled alias), LoRA r=16 alpha 32 on every
linear layer, the same prompts (built-in arithmetic, boxed instruction, chat template), P prompts x G
completions per step, temperature 1, one optimizer step per rollout, lr 1e-4, no KL, and fixed-length
completions (EOS suppressed until max_new_tokens, TRL's min_new_tokens) so both decode exactly the same
number of tokens. Each measurement is a fresh subprocess (clean peak RSS) running warm-up steps then timed
steps; the driver alternates thinkrl and TRL `--rounds` times and reports medians over all timed steps.
Peak memory is the trainer process's own (ru_maxrss; thinkrl's verifier workers are separate processes and
reported apart) or torch.cuda.max_memory_allocated on GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import lengths  # noqa: E402  (bench/lengths.py)
import machine  # noqa: E402  (bench/machine.py)
import random_model  # noqa: E402  (bench/random_model.py)
import tables  # noqa: E402  (bench/tables.py)
from trl_workers import run_thinkrl, run_trl  # noqa: E402  (bench/trl_workers.py: run in the subprocesses)


def settings(a) -> dict:
    return {
        "model": a.model_name,
        "prompts": a.prompts,
        "group": a.group,
        "max_new_tokens": a.max_new_tokens,
        "thinkrl_checkpointing": a.checkpointing,
        "lora_rank": 16,
        "lora_alpha": 32,
        "lr": 1e-4,
        "temperature": 1.0,
        "fixed_length": not a.variable_length,
        "steps": a.steps,
        "warmup": a.warmup,
    }


# ---------------------------------------------------------------- driver


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help=f"an alias, hub id or path; {random_model.NAME} for the GPU config")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8, help="thinkrl train.micro_batch_size")
    p.add_argument(
        "--checkpointing", choices=["auto", "true", "false"], default="auto", help="thinkrl train.gradient_checkpointing (TRL has it on)"
    )
    p.add_argument("--steps", type=int, default=3, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2, help="alternations thinkrl, TRL")
    p.add_argument("--only", choices=["thinkrl", "trl"])
    p.add_argument("--variable-length", action="store_true", help="let completions stop at EOS")
    p.add_argument("--lengths", help="comma-separated completion lengths, e.g. 64,256,1024: one table over all (lengths.py)")
    p.add_argument("--scaling", action="store_true", help="thinkrl only: completion length 64/256/1024 (G=8) and group 4/8/16 (T=256)")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"))
    p.add_argument(
        "--isa",
        choices=["native", "avx2", "both"],
        default="native",
        help="avx2: driver and workers held at AVX2 (machine.HELD_AVX2), as on an AVX2-only CPU; both: native into --out, "
        "then held into its -avx2 sibling",
    )
    p.add_argument("--worker", choices=["thinkrl", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.isa == "avx2" and not a.worker and not machine.held(os.environ):  # the driver too: its roofline runs held
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], {**os.environ, **machine.HELD_AVX2})
    a.model_name, a.model = a.model, random_model.model_dir(a.model)  # the random model is built once, by the driver
    if a.worker:
        result = (run_thinkrl if a.worker == "thinkrl" else run_trl)(a)
        Path(a.json).write_text(json.dumps(result))
        return
    if a.isa == "both":
        a.isa = "native"
        _run(a)
        held = held_argv(sys.argv[1:], a.out)
        print(f"held at AVX2: {held[-1]} ...", flush=True)
        sys.exit(subprocess.run([sys.executable, __file__, *held], env={**os.environ, **machine.HELD_AVX2}).returncode)
    _run(a)


def held_argv(argv: list[str], out: str) -> list[str]:
    """The command line of --isa both's held pass: the same settings, --isa avx2, --out OUT's -avx2 sibling."""
    rest, skip = [], False
    for arg in argv:
        if skip or arg.split("=", 1)[0] in ("--isa", "--out"):
            skip = not skip and "=" not in arg
            continue
        rest.append(arg)
    held_out = Path(out).with_name(f"{Path(out).stem}-avx2{Path(out).suffix}")
    return [*rest, "--isa", "avx2", "--out", os.path.relpath(held_out)]


def _run(a) -> None:
    """One bench run at the ISA this process and its workers run on; writes a.out."""
    worker = lambda trainer, args: _worker(trainer, args, a.isa)  # noqa: E731
    if a.scaling:
        return tables.scaling(a, worker, summarise)
    if a.lengths:
        return lengths.run(a, worker, summarise)
    trainers = [a.only] if a.only else ["thinkrl", "trl"]
    runs: dict[str, list[dict]] = {t: [] for t in trainers}
    for r in range(a.rounds):
        for t in trainers:
            print(f"round {r + 1}/{a.rounds}: {t} ...", flush=True)
            t0 = time.perf_counter()
            runs[t].append(worker(t, sys.argv[1:]))
            print(f"  {runs[t][-1].get('error', 'done')} ({time.perf_counter() - t0:.0f} s)", flush=True)
    tables.report(a, runs, settings, summarise)


def worker_env(isa: str, base: dict | None = None) -> dict:
    """A worker's environment: the driver's, plus the held ISA under --isa avx2 (set here as well as inherited
    from the re-executed driver, so a worker never runs native by accident)."""
    env = {**(os.environ if base is None else base), "TOKENIZERS_PARALLELISM": "false"}
    return {**env, **machine.HELD_AVX2} if isa == "avx2" else env


def _worker(trainer: str, args: list[str], isa: str = "native") -> dict:
    """One measurement in a fresh subprocess (so its peak memory is its own)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, __file__, "--worker", trainer, "--json", out, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=worker_env(isa))
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(Path(out).read_text())


def summarise(runs: list[dict]) -> dict | None:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return None
    med = lambda k: statistics.median([v for r in ok for v in r[k]])  # noqa: E731
    return {
        "step_s": med("step_s"),
        "generate_s": med("generate_s"),
        "score_s": med("score_s"),
        "update_s": med("update_s"),
        "tokens": med("tokens"),
        "peak_mb": max(r["peak_mb"] for r in ok),
        "children_peak_mb": max(r["children_peak_mb"] for r in ok),
        "n": sum(len(r["step_s"]) for r in ok),
    }


if __name__ == "__main__":
    main()
