"""Hardware-specific speed-ups behind one hook per phase; the stages call the hooks and hold the plain path.

What is here (each a CPU path; on CUDA they step aside, and THINKRL_ACCEL=0 turns them off on a CPU too):
packed.py (weights laid out once for oneDNN), fused_lora.py (a LoRA layer as one operation over the packed
base), kept_outputs.py (what a checkpointed layer keeps so its recompute skips the costly parts),
causal_attention.py (the completion pass's attention without a mask), allocator.py with cpu_cache.cpp (large
buffers and a cache of freed blocks), decode_kernel.py with decode_attention.c (the lean decoder's attention
step), native.py (builds the C/C++ sources on first use). None of them changes a number beyond float
rounding; tests/test_accel_switch.py runs the core both ways.

The hooks: `process_start` (once per process), `update_pass` (around one update phase), `phase_end` (after a
generation), `checkpoint_kwargs` / `kept_linears` / `attention_marks` (inside a training forward),
`segment_grads` (the probe: one gradient per replicate from one backward over several) and
`decode_attention_usable` (the lean decoder, whose packed.PackedLinear is plain F.linear when off).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from thinkrl.accel import allocator, causal_attention, decode_kernel, fused_lora, kept_outputs, packed
from thinkrl.accel.switch import enabled

PACK_ROWS = 512  # oneDNN's blocking hint for the frozen weights: tokens per training pass, roughly


def process_start() -> None:
    """Once per process, before the model loads: the allocator settings (allocator.py)."""
    if enabled():
        allocator.tune()


@contextlib.contextmanager
def update_pass(policy, transposed: bool = False) -> Iterator[None]:
    """Around one update phase of `policy` (a peft model): packed frozen weights, fused LoRA layers, the
    completion pass's causal attention; the freed-block cache is emptied after it. `transposed`: the input
    gradients through packed copies of W^T as well, for a caller that runs many backward passes through the
    same frozen weights and has room for a second copy of them (the probe; a training run keeps MKL's
    dy W, docs/benchmarks.md)."""
    if not enabled():
        yield
        return
    with (
        allocator.phase(),
        packed.packed_frozen_linears(policy, PACK_ROWS, transposed),
        fused_lora.fused_lora_layers(policy, PACK_ROWS, transposed),
        causal_attention.prompt_causal_attention(policy.config),
    ):
        yield


@contextlib.contextmanager
def segment_grads(segments: int) -> Iterator[fused_lora.SegmentGrads | None]:
    """Inside an update_pass: the fused LoRA layers' gradients split into `segments` runs of batch rows
    (fused_lora.SegmentGrads), for a caller that wants each part of a batch's own gradient from one backward;
    None when off, and the caller runs the parts one by one."""
    if not enabled():
        yield None
        return
    with fused_lora.segment_grads(segments) as seg:
        yield seg


def phase_end() -> None:
    """After a phase whose large freed blocks the next one cannot use (a generation)."""
    allocator.release()


def attention_marks(config, prompt_padded: bool, completion_len: int) -> dict:
    """The kwargs a completion pass adds to its forward to attend causally without a mask (causal_attention.py)."""
    return causal_attention.marks(config, prompt_padded, completion_len)


def checkpoint_kwargs(keep: frozenset) -> dict:
    """torch.utils.checkpoint's extra arguments for one checkpointed layer: keep the results kept_outputs.py
    names instead of recomputing them (plain recompute when off)."""
    if not enabled():
        return {}
    return {"context_fn": lambda: kept_outputs.kept_in_recompute(keep)}


def kept_linears(policy, tokens: int, bytes_per_value: int, room: int) -> frozenset:
    """(in, out) shapes of the linear layers whose outputs a checkpointed pass of `tokens` tokens keeps."""
    if not enabled():
        return frozenset()
    return kept_outputs.kept_linears(fused_lora.lora_shapes(policy), tokens * bytes_per_value, room)


def decode_attention_usable(keys) -> bool:
    """Whether the lean decoder's attention step runs in the C kernel for storage like `keys`."""
    return enabled() and decode_kernel.usable(keys)
