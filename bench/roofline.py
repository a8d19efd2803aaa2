"""What the hardware allows for one GRPO step: measured matmul peak and memory bandwidth, and the floor they set.

Decoding a batch reads every weight once per generated position, so with few rows it is bound by memory
bandwidth (weight bytes / bandwidth per decode step), not by FLOPs. Prefill and the training pass multiply
many rows per weight read and are bound by the matmul peak (2N FLOPs per token forward, 2N more backward
through the activations; frozen weights under LoRA get no weight gradient). Both are measured here on the
device the bench runs on, so the floor is this machine's, not a datasheet's.
"""

from __future__ import annotations

import statistics
import time

import torch


def _best(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def peak_gflops(dtype: torch.dtype) -> float:
    """Matmul throughput: 2048^3 fp32 on CPU, 8192^3 in the bench dtype on GPU."""
    device, n = ("cuda", 8192) if torch.cuda.is_available() else ("cpu", 2048)
    x = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _best(lambda: torch.mm(x, x)) / 1e9


def bandwidth_gbs() -> float:
    """Memory bandwidth: bytes read plus bytes written by a copy of 512 MiB (CPU) or 2 GiB (GPU)."""
    device, n = ("cuda", 2**29) if torch.cuda.is_available() else ("cpu", 2**27)
    src = torch.empty(n, device=device)
    dst = torch.empty_like(src)
    return 2 * 4 * n / _best(lambda: dst.copy_(src)) / 1e9


def step_floor(
    prompts: int, group: int, new_tokens: int, prompt_len: int, params: int, weight_bytes: int, gflops: float, gbs: float
) -> dict:
    """Seconds one step cannot go below: decode at the bandwidth limit, prefill and training at the FLOP limit."""
    rows = prompts * group
    decode_s = new_tokens * max(weight_bytes / (gbs * 1e9), 2 * params * rows / (gflops * 1e9))
    prefill_s = 2 * params * prompts * prompt_len / (gflops * 1e9)
    train_s = 4 * params * rows * new_tokens / (gflops * 1e9)
    return {"decode_s": decode_s, "prefill_s": prefill_s, "train_s": train_s, "total_s": decode_s + prefill_s + train_s}


def describe(floor: dict, gflops: float, gbs: float, achieved: dict[str, float]) -> str:
    """One paragraph for RESULTS.md: the floor, and each trainer's step time as a fraction of it."""
    parts = ", ".join(f"{name} {floor['total_s'] / s:.0%}" for name, s in achieved.items())
    return (
        f"Roofline: this machine measures {gflops:.0f} GFLOP/s (matmul) and {gbs:.1f} GB/s (copy). Decoding reads "
        f"every weight once per position, so the {floor['decode_s']:.2f} s decode floor is set by bandwidth; prefill "
        f"({floor['prefill_s']:.2f} s) and the training pass ({floor['train_s']:.2f} s: 4N FLOPs per completion token) by "
        f"the matmul peak. A step cannot take less than {floor['total_s']:.2f} s; achieved fraction of that floor: {parts}."
    )


def prompt_tokens(model: str) -> int:
    """Mean token length of the bench's chat-formatted prompts."""
    from thinkrl.config import ArithConfig, PromptConfig
    from thinkrl.data.arith import arith_problems
    from thinkrl.models import load_tokenizer, resolve_path

    tok = load_tokenizer(resolve_path(model))
    texts = [
        [{"role": "user", "content": PromptConfig().instruction.replace("{problem}", p.problem)}]
        for p in arith_problems(ArithConfig(), "train")[:50]
    ]
    lengths = [len(tok.apply_chat_template(t, add_generation_prompt=True, tokenize=True)["input_ids"]) for t in texts]
    return round(statistics.mean(lengths))
