"""Peak memory of a training step, by part, from the config and the model's shape alone (no weights loaded):
what `thinkrl train --dry-run` prints, so a run that will not fit is found before it starts.

Each part follows what the code allocates (the docstring of each function names where); the process
baseline is a measured constant. A step's peak is the parts every phase holds plus the larger of the
generation phase's own parts and the update phase's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from thinkrl.accel.kept_outputs import kept_linears
from thinkrl.forward import CHUNK_ELEMS
from thinkrl.learner.logprobs import activation_bytes, recompute_bytes
from thinkrl.learner.update import ACTIVATION_BUDGET
from thinkrl.rollout.engines.slot_storage import CHUNK

MiB = 2**20
# Peak RSS of a whole `thinkrl train` step (1 prompt x 16 completions x 64 tokens) of tests/tiny.py's
# 38,336-parameter model, whose weights and tensors are negligible: python, torch, transformers, peft,
# accelerate, the tokenizer, the prompts and the allocator. Measured twice (404.6 and 404.8 MiB) on the
# project's 2-core x86_64 machine, torch 2.13 CPU, transformers 5.25 (docs/benchmarks.md, dry-run section).
BASELINE_CPU = 405 * MiB
# On CUDA the tensors are the parts below, and what the device holds besides them is listed as parts of its own
# (device_parts): the CUDA context, NCCL's buffers, a colocated vLLM's reserve. The process's RAM is outside it.
BASELINE_CUDA = 0
# Estimates, not measured here (no GPU): a torch process's CUDA context with lazy module loading (CUDA 11.7+, the
# default) and cuBLAS's workspace come to about 0.5 GiB in nvidia-smi beside torch's own allocations.
CUDA_CONTEXT = 512 * MiB
# NCCL's channel buffers once collectives have run: reported at about 1.06 GB per GPU on 8 x H100 before any
# all-to-all (NVIDIA/nccl#1685) and about 1.6 GB for one communicator after an all-reduce (NVIDIA/nccl#864).
NCCL_BUFFERS = 1024 * MiB
# The device a colocated vLLM's share (rollout.vllm.memory) is of, when the plan is made without a GPU: an H100's 80 GiB
ASSUMED_DEVICE = 80 * 2**30


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of the model, read from a meta-device copy built as the run builds it."""

    config: Any  # the transformers config (activation_bytes / recompute_bytes read it)
    params: int  # the policy's parameters, tied ones once, LoRA included
    trainable: int  # LoRA adapters, or every parameter with lora.rank=0
    trainable_bytes: int  # their element size (peft keeps adapters in float32 over a bfloat16 base)
    copy_params: int  # the sampling copy's parameters (0: it samples with the policy itself)
    copy_linear: int  # of those, in linear layers and the output head (what the lean decoder packs)
    frozen_linear: int  # frozen linear weights of the policy (LoRA base and head): packed for the update
    lora_shapes: Counter = field(default_factory=Counter)  # (in, out) -> LoRA layers (what a replay may keep)

    @property
    def layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def kv_heads(self) -> int:
        return getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads

    @property
    def head_dim(self) -> int:
        c = self.config
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


@dataclass(frozen=True)
class Plan:
    """What the run does, from its config, the engine and the data."""

    device: str  # cpu | cuda
    dtype_bytes: int  # the trainer's compute element size (model.dtype); trained weights: ModelShape.trainable_bytes
    copy_bytes: int  # the sampling copy's (fp8 keeps the trainer's compute dtype)
    slots: int  # completions decoded together: min(rollout.batch_size, completions per step)
    prompt_tokens: int  # the longest prompt
    max_new_tokens: int
    lean: bool  # the lean engine's fused decoder (slot storage, packed weights) decodes
    packs: bool  # oneDNN packs the trainer's weights (CPU float32, thinkrl/accel on)
    packs_copy: bool  # and the sampling copy's (its dtype may differ)
    rows_per_pass: int  # completions in one training pass
    prompts_per_pass: int  # distinct prompts one training pass runs
    checkpointing: bool | str  # train.gradient_checkpointing
    steps: int
    trainable_copies: int  # copies of the trainable weights besides the weights: grads, AdamW moments, snapshots
    reference: bool  # a full reference model (methods needing ref_logp without LoRA)
    vllm_reserve: int = 0  # bytes a colocated vLLM (rollout.engine=vllm on CUDA) reserves: rollout.vllm.memory x the device
    vllm_sleeps: bool = True  # rollout.vllm.sleep: it gives the reserve back during each update


@dataclass(frozen=True)
class Part:
    name: str
    phase: str  # held (every phase) | generation | update
    bytes: int
    how: str


def kv_capacity(prompt: int, new_tokens: int) -> int:
    """Positions per slot the lean decoder's storage reaches (slot_storage.SlotStorage.reserve): the prefill
    reserves the prompt, each decode step one more position, up to prompt + new_tokens - 1 (the last token
    is drawn, never stored); capacity grows by max(CHUNK, half) rounded up to CHUNK, and never past prompt +
    new_tokens (the ceiling lean.py sets)."""
    up = lambda n: -(-n // CHUNK) * CHUNK  # noqa: E731
    cap, final = up(max(prompt, CHUNK)), prompt + new_tokens - 1
    while cap < final:
        cap = up(cap + max(CHUNK, cap // 2))
    return min(cap, prompt + new_tokens)


def kv_bytes(slots: int, positions: int, layers: int, kv_heads: int, head_dim: int, element: int) -> int:
    """Keys and values: slots x positions x layers x 2 x Hk x D x element size."""
    return slots * positions * layers * 2 * kv_heads * head_dim * element


def kv_part(m: ModelShape, p: Plan) -> Part:
    """The lean decoder's slot storage grows in chunks (slot_storage.py); the other engines hold about the live
    tokens, slots x (prompt + budget)."""
    if p.vllm_reserve:
        return Part("KV cache", "generation", 0, "inside vLLM's reserve")
    positions = kv_capacity(p.prompt_tokens, p.max_new_tokens) if p.lean else p.prompt_tokens + p.max_new_tokens
    b = kv_bytes(p.slots, positions, m.layers, m.kv_heads, m.head_dim, p.copy_bytes)
    how = f"{p.slots} slots x {positions:,} positions x {m.layers} layers x 2 x {m.kv_heads} heads x {m.head_dim} x {p.copy_bytes} B"
    return Part("KV cache", "generation", b, how)


def pass_activations(m: ModelShape, p: Plan) -> tuple[int, str]:
    """What one training pass keeps for its backward (learner/update.py _checkpointing): everything under
    train.gradient_checkpointing=false or while it fits ACTIVATION_BUDGET under auto; else each layer's input
    (recompute_bytes) plus, under auto, the linear outputs the rest of the budget keeps (accel/kept_outputs.py)."""
    tokens, size = p.rows_per_pass * p.max_new_tokens, p.dtype_bytes
    full = activation_bytes(m.config, tokens, size)
    auto = p.checkpointing == "auto"
    if p.checkpointing is False or (auto and full <= ACTIVATION_BUDGET):
        return full, f"{p.rows_per_pass} x {p.max_new_tokens} tokens a pass, not checkpointed"
    kept = recompute_bytes(m.config, tokens, size)
    if auto and p.packs:  # thinkrl/accel on: the replay keeps linear outputs within the budget
        room = ACTIVATION_BUDGET - kept
        kept += sum(m.lora_shapes[s] * s[1] * tokens * size for s in kept_linears(m.lora_shapes, tokens * size, room))
    return kept, f"{p.rows_per_pass} x {p.max_new_tokens} tokens a pass, checkpointed"


def prompt_activations(m: ModelShape, p: Plan) -> int:
    """The pass's prompt forward (not checkpointed) and its key/value cache, repeated for each row (forward.py)."""
    tokens = p.prompts_per_pass * p.prompt_tokens
    cache = kv_bytes(p.rows_per_pass, p.prompt_tokens, m.layers, m.kv_heads, m.head_dim, p.dtype_bytes)
    return activation_bytes(m.config, tokens, p.dtype_bytes) + cache


def logits_bytes(m: ModelShape, p: Plan) -> tuple[int, int]:
    """The output head's float32 chunk (learner/logprobs.py, head.py FusedHead): logits and probabilities of
    at most CHUNK_ELEMS // vocab positions at once. Returns (bytes, positions)."""
    vocab = m.config.vocab_size
    rows = min(p.rows_per_pass * p.max_new_tokens, max(1, CHUNK_ELEMS // vocab))
    return 2 * rows * vocab * 4, rows


def device_parts(p: Plan, processes: int = 1) -> list[Part]:
    """What a CUDA device holds beside the run's tensors: the CUDA context, NCCL's buffers with several processes
    (both estimates, see CUDA_CONTEXT), and a colocated vLLM's reserve, which with vllm.sleep it releases during
    each update (sleep level 1: weights to RAM, KV cache freed; thinkrl/rollout/engines/vllm.py)."""
    if p.device != "cuda":
        return []
    out = [Part("CUDA context", "held", CUDA_CONTEXT, "estimate: context, kernels loaded lazily, cuBLAS workspace")]
    if processes > 1:
        out.append(Part("NCCL buffers", "held", NCCL_BUFFERS, "estimate: channel buffers (NVIDIA/nccl#864, #1685)"))
    if p.vllm_reserve:
        phase = "generation" if p.vllm_sleeps else "held"
        out.append(Part("vLLM reserve", phase, p.vllm_reserve, "rollout.vllm.memory x the device: its weights, KV cache, graphs"))
    return out


def parts(m: ModelShape, p: Plan, baseline: int) -> list[Part]:
    """Every part of a step's memory, in the order printed."""
    out = [Part("process baseline", "held", baseline, "measured: python, torch, transformers, tokenizer (preview/memory.py)")]
    out += device_parts(p)
    frozen = m.params - m.trainable
    weights = frozen * p.dtype_bytes + m.trainable * m.trainable_bytes
    out.append(Part("weights", "held", weights, f"{frozen:,} x {p.dtype_bytes} B + {m.trainable:,} trainable x {m.trainable_bytes} B"))
    if m.copy_params:
        out.append(Part("sampling copy", "held", m.copy_params * p.copy_bytes, f"{m.copy_params:,} parameters x {p.copy_bytes} B"))
    else:
        out.append(Part("sampling copy", "held", 0, "none: samples with the policy's own weights"))
    if p.reference:
        out.append(Part("reference model", "held", m.params * p.dtype_bytes, "a frozen copy of the base model (ref_logp without LoRA)"))
    trained = m.trainable * m.trainable_bytes * p.trainable_copies
    out.append(
        Part("grads + AdamW state", "held", trained, f"{m.trainable:,} trainable x {p.trainable_copies} copies x {m.trainable_bytes} B")
    )
    out.append(kv_part(m, p))
    if p.packs_copy and p.lean and m.copy_params:
        out.append(Part("packed sampling copy", "generation", m.copy_linear * p.copy_bytes, "its linear weights in oneDNN's layout"))
    if p.packs and m.frozen_linear:
        phase = "held" if p.steps > 1 else "update"  # made in the first update, kept for the run
        out.append(Part("packed frozen weights", phase, m.frozen_linear * p.dtype_bytes, "oneDNN layout, kept after the first update"))
    act, how = pass_activations(m, p)
    out.append(Part("activations", "update", act + prompt_activations(m, p), how + f", plus the prompt pass ({p.prompt_tokens} tokens)"))
    logits, rows = logits_bytes(m, p)
    out.append(Part("logits chunk", "update", logits, f"2 x {rows:,} positions x {m.config.vocab_size:,} vocab x 4 B (float32)"))
    return out


def peak(all_parts: list[Part]) -> tuple[int, dict[str, int]]:
    """The step's peak: what is held throughout plus the larger phase; and each phase's own total."""
    phases = {ph: sum(x.bytes for x in all_parts if x.phase == ph) for ph in ("held", "generation", "update")}
    return phases["held"] + max(phases["generation"], phases["update"]), phases


def report(all_parts: list[Part], device: str, whose: str = "") -> str:
    """The lines --dry-run prints: each part, then the peak and which phase sets it. `whose`: which device of a
    layout the parts are one of (preview/layout.py), e.g. "per trainer device"."""
    total, phases = peak(all_parts)
    where = "RAM (peak RSS)" if device == "cpu" else "GPU memory (tensors, CUDA context, NCCL, vLLM's reserve; not the allocator's slack)"
    lines = [f"memory estimate{' ' + whose if whose else ''}, {where}:"]
    for x in all_parts:
        lines.append(f"  {x.name:<22} {x.bytes / MiB:>9,.0f} MiB  {x.phase:<10}  {x.how}")
    top = "generation" if phases["generation"] >= phases["update"] else "update"
    lines.append(
        f"  {'peak':<22} {total / MiB:>9,.0f} MiB  held + {top} ({phases['generation'] / MiB:,.0f} MiB generation, "
        f"{phases['update'] / MiB:,.0f} MiB update)"
    )
    return "\n".join(lines)
