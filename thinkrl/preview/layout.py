"""Memory per device when a run is spread over several devices: `thinkrl train --dry-run --processes N
--sharding none|fsdp2 [--server-devices M] [--device cuda]`. memory.py estimates one process; this module
says what each of N trainer processes holds, and each of M vLLM server devices, so a multi-GPU plan that
will not fit is found on a laptop before any GPU is rented.

    --sharding none    DDP: every trainer device holds everything a single process does, plus DDP's
                       gradient buckets, for its share of the step's prompts (prompts_per_step / N)
    --sharding fsdp2   torch FSDP2 (fully_shard through Accelerate, thinkrl/sharding.py): each parameter,
                       its gradient and its AdamW moments are split on dim 0 over the N ranks, dim 0 padded to
                       a multiple of N, so a rank holds ceil(dim0 / N) x (the other dims) elements of each.
                       A training pass unshards one FSDP unit at a time (see `unsharded`); the colocated
                       sampler still decodes with FULL weights, gathered once per update (policy_copy.py)
    --server-devices M the sampler is a vLLM server on M other devices (tensor parallel M): the trainer
                       devices hold no sampling copy and no key/value cache; each server device holds 1/M
                       of the sampling weights and of the key/value heads

Everything is per device: activations and key/value cache are those of one rank's prompts. The CUDA context,
NCCL's buffers and a colocated vLLM's reserve are memory.device_parts'. Not counted: the optimizer step's
temporaries (AdamW's foreach ops), the one full parameter the sampler's refresh gathers at a time, the caching
allocator's slack, and on a vLLM server its workspace and CUDA graphs (vLLM reserves rollout.vllm.memory of the
device whatever the model needs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from thinkrl.errors import UserError
from thinkrl.preview.memory import (
    ModelShape,
    Part,
    Plan,
    device_parts,
    kv_bytes,
    kv_part,
    logits_bytes,
    pass_activations,
    prompt_activations,
)

SHARDINGS = ("none", "fsdp2")
DEVICES = ("auto", "cpu", "cuda")
SERVER_ENGINES = ("auto", "vllm_server")  # rollout.engine values a --server-devices plan agrees with


@dataclass(frozen=True)
class Layout:
    """Where the run's processes are: what --processes, --sharding, --server-devices and --device say."""

    processes: int = 1  # trainer processes, one device each
    sharding: str = "none"  # none (DDP) | fsdp2
    server_devices: int = 0  # devices of a separate vLLM server (0: the sampler runs in each trainer process)
    device: str = "auto"  # what the plan is for: auto (this machine's), cpu, cuda

    @property
    def single(self) -> bool:
        """One process sampling in itself: memory.py's estimate, printed as before."""
        return self.processes == 1 and self.sharding == "none" and not self.server_devices

    def line(self) -> str:
        share = {
            "none": "DDP: every device holds every weight",
            "fsdp2": f"FSDP2: weights, gradients and AdamW state sharded {self.processes} ways",
        }
        sampler = f"a vLLM server on {self.server_devices} other devices samples" if self.server_devices else "each process samples itself"
        return f"{self.processes} trainer processes, {share[self.sharding]}; {sampler}"


def from_flags(processes: int | None, sharding: str | None, server_devices: int | None, device: str | None, dry_run: bool) -> Layout:
    """The flags' layout, each checked before anything loads; they plan a dry run only."""
    flags = {"--processes": processes, "--sharding": sharding, "--server-devices": server_devices, "--device": device}
    given = [f for f, v in flags.items() if v is not None]
    if given and not dry_run:
        raise UserError(
            f"{given[0]} applies only with --dry-run (a memory plan); a run takes its processes from torchrun or accelerate launch "
            "and its sharding from the accelerate config (docs/distributed.md)"
        )
    if processes is not None and processes < 1:
        raise UserError(f"--processes {processes}: give the number of trainer processes (one per device), 1 or more, e.g. --processes 8")
    if sharding is not None and sharding not in SHARDINGS:
        raise UserError(f"--sharding {sharding}: not a sharding strategy; choose none (DDP: every device holds everything) or fsdp2")
    if server_devices is not None and server_devices < 1:
        raise UserError(
            f"--server-devices {server_devices}: give the vLLM server's device count, 1 or more (or drop the flag to sample in the trainer)"
        )
    if device is not None and device not in DEVICES:
        raise UserError(f"--device {device}: plan for auto (this machine's device), cpu or cuda")
    return Layout(processes or 1, sharding or "none", server_devices or 0, device or "auto")


def check_config(layout: Layout, cfg) -> None:
    """What a run with this layout would refuse (train.py's process-count check), and a server plan for a
    config that samples elsewhere."""
    pps, n = cfg.rollout.prompts_per_step, layout.processes
    if pps % n:
        fit = -(-pps // n) * n
        raise UserError(
            f"rollout.prompts_per_step={pps} must be a multiple of the {n} processes (each takes whole groups); "
            f"e.g. -o rollout.prompts_per_step={fit}, or another --processes"
        )
    engine = cfg.rollout.engine
    if layout.server_devices and engine not in SERVER_ENGINES:
        raise UserError(
            f"--server-devices {layout.server_devices} plans a vLLM server, but rollout.engine={engine} samples in the trainer; "
            "drop --server-devices, or sample with the server (rollout.engine=vllm_server)"
        )
    if engine == "vllm_server" and not layout.server_devices:
        raise UserError("rollout.engine=vllm_server samples on a separate server: say on how many devices with --server-devices M")


def shard_elements(shape: tuple[int, ...], n: int) -> int:
    """Elements one of n FSDP2 ranks holds of a parameter of this shape: dim 0 is padded to a multiple of n
    and split, so ceil(dim0 / n) x the other dims (a 0-d parameter counts as one element on every rank)."""
    if not shape:
        return 1
    return -(-shape[0] // n) * math.prod(shape[1:])


@dataclass(frozen=True)
class Sharded:
    """Element counts of the policy under FSDP2 over n ranks, read from the meta model."""

    frozen: int  # this rank's elements of the frozen parameters
    trainable: int  # this rank's elements of the trainable ones
    root: int  # full elements of the root unit: everything outside a decoder layer (embedding, final norm, head)
    root_trainable: int  # of those, trainable
    layer: int  # full elements of the largest decoder layer (one FSDP unit each)
    layer_trainable: int  # the most trainable elements of a decoder layer


def sharded(policy, n: int) -> Sharded:
    """Each parameter's shard (shard_elements) and the units Accelerate's TRANSFORMER_BASED_WRAP makes: one per
    decoder layer (the model's _no_split_modules, as learner/logprobs.py PolicyLogProbs names them), and the
    root, which holds the rest."""
    base = getattr(policy, "get_base_model", lambda: policy)()
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in policy.modules() if type(m).__name__ in names]
    in_layer = {id(p) for m in layers for p in m.parameters()}
    frozen = trainable = root = root_trainable = 0
    for p in policy.parameters():  # tied parameters once
        own = shard_elements(tuple(p.shape), n)
        frozen, trainable = (frozen, trainable + own) if p.requires_grad else (frozen + own, trainable)
        if id(p) not in in_layer:
            root += p.numel()
            root_trainable += p.numel() if p.requires_grad else 0
    layer = max((sum(p.numel() for p in m.parameters()) for m in layers), default=0)
    layer_trainable = max((sum(p.numel() for p in m.parameters() if p.requires_grad) for m in layers), default=0)
    return Sharded(frozen, trainable, root, root_trainable, layer, layer_trainable)


def _bytes(elements: int, trainable: int, p: Plan, m: ModelShape) -> int:
    """elements of which `trainable` are trainable: frozen ones in the trainer's dtype, trainable ones in theirs."""
    return (elements - trainable) * p.dtype_bytes + trainable * m.trainable_bytes


def unsharded(m: ModelShape, p: Plan, s: Sharded) -> Part:
    """What FSDP2 holds whole during a training pass, at most: the root unit's parameters (all-gathered for the
    whole forward, which runs inside it, and again for the whole backward) and its gradients (reduce-scattered
    only when the embedding's, the last, arrive); and the larger of two decoder layers' parameters (the one
    running and the next, prefetched) with one layer's gradients before their reduce-scatter, and the root's
    own reduce-scatter at the end. Masters in another dtype than the compute's (sharding.precision_policy):
    parameters are gathered and gradients made in the compute dtype, then copied to the masters' dtype to be
    reduce-scattered, so each reduce holds the unit's gradients twice."""
    mixed = p.dtype_bytes != m.trainable_bytes
    gathered = lambda e, t: e * p.dtype_bytes if mixed else _bytes(e, t, p, m)  # noqa: E731
    grad = p.dtype_bytes if mixed else m.trainable_bytes  # per trainable element, as autograd makes it
    copy = m.trainable_bytes if mixed else 0  # the reduce dtype's copy
    root = gathered(s.root, s.root_trainable) + s.root_trainable * grad
    layers = 2 * gathered(s.layer, s.layer_trainable) + s.layer_trainable * (grad + copy)
    how = f"whole: root unit {s.root:,} + {s.root_trainable:,} grads; 2 layers of {s.layer:,} + {s.layer_trainable:,} grads"
    if mixed:
        how = how.replace("whole:", f"whole, {p.dtype_bytes} B each:") + f" and their {copy} B reduce copy, or the root's copy if larger"
    return Part("FSDP2 unsharded", "update", root + max(layers, s.root_trainable * copy), how)


def trainer_parts(m: ModelShape, p: Plan, layout: Layout, s: Sharded | None, baseline: int) -> list[Part]:
    """One trainer device's parts, in the order printed. `p` is one rank's plan (its share of the prompts);
    `s` the FSDP2 shards (None: DDP)."""
    n, tb, server = layout.processes, m.trainable_bytes, layout.server_devices
    out = [Part("process baseline", "held", baseline, "measured: python, torch, transformers, tokenizer (preview/memory.py)")]
    out += device_parts(p, n)
    add = lambda *a: out.append(Part(*a))  # noqa: E731
    frozen, trained = (s.frozen, s.trainable) if s else (m.params - m.trainable, m.trainable)
    each, sharded_ = (f"ceil(dim0 / {n}) x rest of each: ", ", sharded") if s else ("", "")
    terms = [f"{frozen:,} x {p.dtype_bytes} B"] * bool(frozen) + [f"{trained:,} trainable x {tb} B"] * bool(trained)
    add("weights", "held", frozen * p.dtype_bytes + trained * tb, each + " + ".join(terms))
    copy = m.copy_params or m.params
    if server:
        add("sampling copy", "held", 0, f"none here: the vLLM server ({server} devices) holds it")
    elif s:
        add("sampling copy", "held", copy * p.copy_bytes, f"{copy:,} parameters x {p.copy_bytes} B, whole: gathered once per update")
    elif m.copy_params:
        add("sampling copy", "held", m.copy_params * p.copy_bytes, f"{m.copy_params:,} parameters x {p.copy_bytes} B")
    else:
        add("sampling copy", "held", 0, "none: samples with the policy's own weights")
    if p.reference:
        add("reference model", "held", m.params * p.dtype_bytes, "the frozen base model, whole on every device (ref_logp without LoRA)")
    add("gradients", "held", trained * tb, f"{trained:,} trainable x {tb} B{sharded_}")
    add("AdamW moments", "held", 2 * trained * tb, f"2 moments x {trained:,} trainable x {tb} B{sharded_}")
    extra = p.trainable_copies - 3  # memory.Plan counts grads and the two moments as 3; the rest are whole copies
    if extra:
        add(
            "trainable snapshots",
            "held",
            extra * m.trainable * tb,
            f"{extra} x {m.trainable:,} x {tb} B, whole: the LoRA sampler's adapters, staleness snapshots",
        )
    if s:
        out.append(unsharded(m, p, s))
    elif n > 1:
        add("DDP buckets", "held", m.trainable * tb, f"{m.trainable:,} x {tb} B: the all-reduce's copy of the grads (no bucket view)")
    if server:
        add("KV cache", "generation", 0, "none here: the vLLM server holds it")
    else:
        out.append(kv_part(m, p))
    if p.packs_copy and p.lean and m.copy_params and not server:
        add("packed sampling copy", "generation", m.copy_linear * p.copy_bytes, "its linear weights in oneDNN's layout")
    if p.packs and m.frozen_linear:
        phase = "held" if p.steps > 1 else "update"  # made in the first update, kept for the run
        add("packed frozen weights", phase, m.frozen_linear * p.dtype_bytes, "oneDNN layout, kept after the first update")
    act, how = pass_activations(m, p)
    add("activations", "update", act + prompt_activations(m, p), how + f", plus the prompt pass ({p.prompt_tokens} tokens)")
    logits, rows = logits_bytes(m, p)
    add("logits chunk", "update", logits, f"2 x {rows:,} positions x {m.config.vocab_size:,} vocab x 4 B (float32)")
    return out


def server_parts(m: ModelShape, p: Plan, layout: Layout, slots: int) -> list[Part]:
    """One vLLM server device's parts under tensor parallelism over M devices: 1/M of the sampling weights, and
    the key/value cache of every rank's completions (`slots` decoded together) with the key/value heads split
    M ways (replicated when there are fewer heads than devices), about the live tokens (prompt + budget)."""
    M = layout.server_devices
    params = m.copy_params or m.params
    heads = -(-m.kv_heads // M)  # per device
    positions = p.prompt_tokens + p.max_new_tokens
    kv = kv_bytes(slots, positions, m.layers, heads, m.head_dim, p.copy_bytes)
    kv_how = f"{slots} slots x {positions:,} positions x {m.layers} layers x 2 x {heads} heads x {m.head_dim} x {p.copy_bytes} B"
    return [
        Part(
            "sampling weights", "held", -(-params * p.copy_bytes // M), f"{params:,} parameters x {p.copy_bytes} B / {M} (tensor parallel)"
        ),
        Part("KV cache", "generation", kv, kv_how),
    ]
