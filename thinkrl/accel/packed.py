"""Linear layers whose weights are laid out once for oneDNN's CPU matmul ("packed"), for weights that stay
fixed while they are used many times: a sampling copy over one generation call, a frozen LoRA base over a
whole run (packed at the first update phase, kept for the next ones).

Why: torch's default float32 CPU matmul is MKL's sgemm over the plain (out, in) layout; oneDNN over its own
blocked layout was faster on this project's machines, most at the few rows of a decode step
(docs/benchmarks.md). Results differ from F.linear's by summation order only. Packing costs about one copy of
the weights, so it pays only for a weight used many times. On CUDA, without oneDNN, for a dtype it does not
pack, or with THINKRL_ACCEL=0, `PackedLinear` is plain F.linear.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from thinkrl.accel.switch import enabled
from thinkrl.models import forwards_replaced


def can_pack(weight: Tensor) -> bool:
    """True where oneDNN can pack this weight: a CPU float32 matrix (bfloat16 only where the CPU computes in
    it), with the ops in this torch build."""
    ops = torch.ops.mkldnn
    if not enabled():  # THINKRL_ACCEL=0: plain F.linear
        return False
    if not (weight.device.type == "cpu" and weight.dim() == 2 and torch.backends.mkldnn.is_available()):
        return False
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    if weight.dtype == torch.bfloat16:
        return hasattr(ops, "_is_mkldnn_bf16_supported") and bool(ops._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


class PackedLinear:
    """x @ weight.T + bias with `weight` (out, in) packed once; `rows` is oneDNN's hint for the number of
    input rows per call (any count works; the hint only steers the blocking). The packed weight is a copy:
    later in-place changes to `weight` are not seen, so build one after every weight update."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, rows: int = 16) -> None:
        weight = weight.detach()
        self.packed = can_pack(weight)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, max(1, rows)) if self.packed else weight
        self.bias = bias.detach() if bias is not None else None
        self.out_features = weight.shape[0]

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) -> (..., out)"""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class _FrozenLinear(torch.autograd.Function):
    """y = x W^T + b for a frozen W, the forward through the packed weight. The gradient flows to x alone,
    dx = dy W, through the plain W: packing W^T as well measured only a few per cent faster at the cost of
    another copy of every weight."""

    @staticmethod
    def forward(ctx, x: Tensor, packed: PackedLinear, weight: Tensor) -> Tensor:
        ctx.weight = weight
        return packed(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad @ ctx.weight, None, None


def kept_packing(m: torch.nn.Linear, rows: int) -> PackedLinear:
    """m's packed weight, made again only when the weight tensor was replaced or written in place."""
    stamp = (m.weight.data_ptr(), m.weight._version, None if m.bias is None else (m.bias.data_ptr(), m.bias._version))
    kept = m.__dict__.get("_thinkrl_packed")
    if kept is None or kept.stamp != stamp:
        kept = _Kept(stamp, PackedLinear(m.weight, m.bias, rows))
        m.__dict__["_thinkrl_packed"] = kept
    return kept.linear


class _Kept:
    """A module's packed weight and the stamp of the weight it was made from. A copied or pickled module
    carries none (packed tensors have no storage to copy): the copy packs again when it needs to."""

    def __init__(self, stamp: tuple, linear: PackedLinear) -> None:
        self.stamp, self.linear = stamp, linear

    def __deepcopy__(self, memo) -> None:
        return None

    def __reduce__(self):
        return type(None), ()


def _frozen_forward(packed: PackedLinear, weight: Tensor):
    return lambda x: _FrozenLinear.apply(x, packed, weight)


@contextlib.contextmanager
def packed_frozen_linears(model: torch.nn.Module, rows: int) -> Iterator[int]:
    """Inside the block, every frozen nn.Linear of `model` (a LoRA base layer) runs its forward through a
    packed copy of its weight; trainable ones are untouched. The copy is kept on the module for the next
    block (a frozen weight does not change: packing once per run, not once per step, saves ~0.2 s a step for
    SmolLM2 here) and made again if the weight was written since. Memory: one more copy of the frozen
    weights. Yields how many layers run packed (0 where nothing can be)."""
    frozen = [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad and can_pack(m.weight)]
    with forwards_replaced({m: _frozen_forward(kept_packing(m, rows), m.weight.detach()) for m in frozen}):
        yield len(frozen)
