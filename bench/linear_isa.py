"""oneDNN-packed linears (thinkrl/accel/packed.py) against F.linear (MKL's sgemm) for the bundled model's matmul
shapes, at the row counts of a decode step (16, 32) and of a training pass (1,024), in this process's ISA: the
question of issue 38 is whether an AVX2-only CPU should keep the packed path.

    python bench/linear_isa.py              # native ISA, then held at AVX2 (machine.HELD_AVX2), one table

Each cell is the best of 3 timings of a loop sized to about 2e8 multiply-adds; time in microseconds per call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import machine  # noqa: E402

# SmolLM2-135M: hidden 576, 9 query and 3 key/value heads of 64, MLP 1,536, vocabulary 49,152
SHAPES = {"qkv": (576 + 2 * 192, 576), "o": (576, 576), "gate_up": (2 * 1536, 576), "down": (576, 1536), "lm_head": (49152, 576)}
ROWS = (16, 32, 1024)


def best_us(fn, calls: int) -> float:
    """The best of 3 timed loops of `calls` calls, after 3 warm-up calls; microseconds per call."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return min(times)


def measure() -> dict:
    import torch
    import torch.nn.functional as F

    from thinkrl.accel.packed import PackedLinear

    torch.manual_seed(0)
    cells = {}
    for rows in ROWS:
        for name, (out, inp) in SHAPES.items():
            if rows == 1024 and name == "lm_head":  # the training head runs chunked through its own path
                continue
            w, x = torch.randn(out, inp) * 0.02, torch.randn(rows, inp)
            packed = PackedLinear(w, None, rows)
            calls = max(5, int(2e8 / (rows * out * inp)))
            plain = best_us(lambda x=x, w=w: F.linear(x, w), calls)
            cells[f"{rows} x {name}"] = (plain, best_us(lambda x=x, packed=packed: packed(x), calls))
    return {"machine": machine.describe(machine.machine()), "cells": cells}


def main() -> None:
    if "--worker" in sys.argv:
        print("RESULT " + json.dumps(measure()))
        return
    results = []
    for env in ({}, machine.HELD_AVX2):
        proc = subprocess.run([sys.executable, __file__, "--worker"], env={**os.environ, **env}, capture_output=True, text=True, check=True)
        results.append(json.loads(proc.stdout.split("RESULT ", 1)[1]))
    print("\n".join(f"- {r['machine']}" for r in results))
    print("\n| shape (rows x matmul) | " + " | ".join(f"MKL / packed, {i}" for i in ("native", "held AVX2")) + " |\n|---|---|---|")
    for cell in results[0]["cells"]:
        pairs = [r["cells"][cell] for r in results]
        print(f"| {cell} | " + " | ".join(f"{mkl:.0f} / {packed:.0f} us ({packed / mkl:.2f}x)" for mkl, packed in pairs) + " |")


if __name__ == "__main__":
    main()
