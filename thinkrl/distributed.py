"""What the train loop needs to know when several processes run it (torchrun / `accelerate launch`).

thinkrl has no distribution layer of its own: Accelerate wraps the model (DDP, FSDP or DeepSpeed) and the
process group. This module only answers the questions the loop asks about the other ranks:

- which of the step's prompts are mine: a contiguous slice of the global prompt list, so each group of G
  completions lives on one rank and its advantages need nothing from the others;
- how many tokens and sequences the whole update batch has: losses divide by global counts, and since
  DDP/FSDP average gradients over ranks, each rank scales its loss by the world size, so the applied
  gradient is the one a single process would compute over the global batch;
- what to log: per-row values (rewards, lengths) are gathered so the logged statistics are the global
  batch's, and only rank 0 writes metrics, rollouts and checkpoints.

With one process every function is the identity and no collective is called.

The collectives' tensors live on the run's training device, which train.py hands over once (`set_device`, the
Accelerator's device). Accelerate starts NCCL on GPUs, and NCCL serves CUDA tensors only; gloo, on a CPU run,
serves CPU tensors. Taking the Accelerator's device rather than a backend-to-device table of our own follows
whatever backend Accelerate chose for its device. float64 on the device keeps the sums exact as before.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_device = torch.device("cpu")  # where collective tensors live (set_device); the CPU until told otherwise


def set_device(device: torch.device | str) -> None:
    """The device of every later collective's tensors in this process: the Accelerator's device (train.py)."""
    global _device
    _device = torch.device(device)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def shard(items: list, rank: int, size: int) -> list:
    """This rank's contiguous share of items; len(items) must divide by size (checked by the config)."""
    n = len(items) // size
    return items[rank * n : (rank + 1) * n]


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks of a short list of numbers (one collective)."""
    if world()[1] == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_device)
    dist.all_reduce(t)
    return t.tolist()


def all_max(value: float) -> float:
    if world()[1] == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def all_gather(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] (pickled; for logs, not for tensors on the hot path)."""
    if world()[1] == 1:
        return [obj]
    out: list = [None] * world()[1]
    dist.all_gather_object(out, obj)
    return out


def all_sum_tensor(t: torch.Tensor) -> torch.Tensor:
    """t summed element-wise over ranks, in place (a collective on t's device); one process: t."""
    if world()[1] > 1:
        dist.all_reduce(t)
    return t


def gather_rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every rank's t (b_r, ...) in rank order along dim 0, each padded with zeros along dim 1 to the longest
    (ranks hold consecutive blocks of the global batch, so this is the batch one process would hold), and where
    this rank's rows start. A collective on t's own device, which is the accelerator's (NCCL takes no CPU
    tensor). One process: (t, 0)."""
    rank, size = world()
    if size == 1:
        return t, 0
    shapes = all_gather(tuple(t.shape))
    whole = [max(s[0] for s in shapes), *t.shape[1:]]
    if t.dim() > 1:  # completions of another length: pad to the longest
        whole[1] = max(s[1] for s in shapes)
    padded = t.new_zeros(whole)
    padded[tuple(slice(0, n) for n in t.shape)] = t
    wire = padded.to(torch.uint8) if padded.dtype == torch.bool else padded  # gloo has no bool all_gather
    parts = [torch.empty_like(wire) for _ in shapes]
    dist.all_gather(parts, wire)
    rows = torch.cat([p[: s[0]] for p, s in zip(parts, shapes)]).to(t.dtype)
    return rows, sum(s[0] for s in shapes[:rank])


def sum_dicts(sums: dict[str, float]) -> dict[str, float]:
    """Key-wise sum over ranks; a key missing on some rank counts 0 there."""
    if world()[1] == 1:
        return dict(sums)
    keys = sorted({k for d in all_gather(sorted(sums)) for k in d})
    return dict(zip(keys, all_sum([float(sums.get(k, 0.0)) for k in keys])))


def mean_dicts(values: dict[str, float]) -> dict[str, float]:
    """Key-wise mean over the ranks that have the key (rank-local statistics such as a method's state)."""
    if world()[1] == 1:
        return dict(values)
    gathered = all_gather(values)
    keys = list(dict.fromkeys(k for d in gathered for k in d))
    return {k: sum(d[k] for d in gathered if k in d) / sum(k in d for d in gathered) for k in keys}


def shutdown() -> None:
    """Close the process group in order before the interpreter exits.

    Left to interpreter exit, gloo's threads are torn down with the C++ statics and, on a loaded machine, a rank
    now and then aborts there ("terminate called without an active exception") after its work is done.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
