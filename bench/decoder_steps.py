"""The lean decoder's step against the static decoder it replaced, in one process, alternating step by step.

Separate processes on a shared 2-core machine drift by 10-20% between minutes, more than the difference being
measured; here both decoders hold the same model, the same prompt's keys and values and the same input tokens,
and take turns (the order rotates every step), so drift falls on both alike. Prints each one's mean time per
step and the ratio, and checks that both give the same logits.

    python bench/decoder_steps.py --old-checkout /tmp/old --rows 16      (OLD: a checkout of commit aeb641f)
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import types
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-checkout", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=100, help="prompt length in tokens")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from thinkrl.models import load_base
    from thinkrl.rollout.engines.lean_decoder import LeanDecoder

    spec = importlib.util.spec_from_file_location("old_fastdecode", a.old_checkout / "thinkrl" / "fastdecode.py")
    assert spec and spec.loader, f"no thinkrl/fastdecode.py under {a.old_checkout}"
    old_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old_module)
    torch.manual_seed(0)
    model, _ = load_base("smollm2-135m", torch.float32)
    model.eval().requires_grad_(False)
    B, L, T = a.rows, a.prompt, a.steps
    old, new = old_module.LeanDecoder(model), LeanDecoder(model)
    prompt = torch.randint(100, 1000, (L,)).tolist()

    def one_round() -> tuple[float, float, float]:
        new.reset(B)
        new.prefill(torch.arange(B), [prompt[:-1]], torch.zeros(B, dtype=torch.long))
        cache = [
            types.SimpleNamespace(keys=k[:, :, : L - 1].clone(), values=v[:, :, : L - 1].clone())
            for k, v in zip(new.kv.keys, new.kv.values, strict=True)
        ]
        old.start(types.SimpleNamespace(layers=cache), None, T)  # the same keys and values, no padding
        tokens, live = torch.full((B,), prompt[-1]), torch.ones(B, dtype=torch.bool)
        spent, gap = {"new": 0.0, "old": 0.0}, 0.0
        for t in range(T):
            out = {}
            for name in ["new", "old"] if t % 2 else ["old", "new"]:
                start = time.perf_counter()
                out[name] = new.step(tokens, live) if name == "new" else old.step(tokens, torch.full((B,), L - 1 + t))
                spent[name] += time.perf_counter() - start
            gap = max(gap, float((out["new"] - out["old"]).abs().max()))
            tokens = out["new"].argmax(-1)
        return spent["new"], spent["old"], gap

    one_round()  # warm-up
    total = {"new": 0.0, "old": 0.0}
    for r in range(a.rounds):
        n, o, gap = one_round()
        total["new"], total["old"] = total["new"] + n, total["old"] + o
        print(f"round {r}: new {1000 * n / T:.1f} ms/step, old {1000 * o / T:.1f} ms/step, largest logit gap {gap:.1e}")
    print(f"{B} rows: new step / old step = {total['new'] / total['old']:.3f}")


if __name__ == "__main__":
    main()
