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
    dx = dy W: through the plain W, or through a packed W^T (`transposed`) where a caller asked for one."""

    @staticmethod
    def forward(ctx, x: Tensor, packed: PackedLinear, weight: Tensor, transposed: PackedLinear | None) -> Tensor:
        ctx.weight, ctx.transposed = weight, transposed
        return packed(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return input_grad(grad, ctx.weight, ctx.transposed), None, None, None


def input_grad(grad: Tensor, weight: Tensor, transposed: PackedLinear | None) -> Tensor:
    """dy W for a frozen W (out, in): through its packed transpose when there is one, else MKL on W.  (N, out) -> (N, in)"""
    return transposed(grad) if transposed is not None else grad @ weight


def kept_packing(m: torch.nn.Linear, rows: int, transposed: bool = False) -> PackedLinear:
    """m's packed weight (`transposed`: its W^T, so that dy W runs as a packed linear), made again only when
    the weight tensor was replaced or written in place."""
    stamp = (m.weight.data_ptr(), m.weight._version, None if m.bias is None else (m.bias.data_ptr(), m.bias._version))
    key = "_thinkrl_packed_t" if transposed else "_thinkrl_packed"
    kept = m.__dict__.get(key)
    if kept is None or kept.stamp != stamp:
        linear = PackedLinear(m.weight.t().contiguous(), None, rows) if transposed else PackedLinear(m.weight, m.bias, rows)
        kept = _Kept(stamp, linear)
        m.__dict__[key] = kept
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


def _frozen_forward(packed: PackedLinear, weight: Tensor, transposed: PackedLinear | None):
    return lambda x: _FrozenLinear.apply(x, packed, weight, transposed)


@contextlib.contextmanager
def packed_frozen_linears(model: torch.nn.Module, rows: int, transposed: bool = False) -> Iterator[int]:
    """Inside the block, every frozen nn.Linear of `model` (a LoRA base layer) runs its forward through a
    packed copy of its weight; trainable ones are untouched. The copy is kept on the module for the next
    block (a frozen weight does not change: packing once per run, not once per step, saves ~0.2 s a step for
    SmolLM2 here) and made again if the weight was written since. Memory: one more copy of the frozen
    weights, two with `transposed` (W^T packed too, for the input gradient). Yields how many layers run
    packed (0 where nothing can be)."""
    frozen = [m for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad and can_pack(m.weight)]

    def frozen_forward(m):
        return _frozen_forward(kept_packing(m, rows), m.weight.detach(), kept_packing(m, rows, True) if transposed else None)

    with forwards_replaced({m: frozen_forward(m) for m in frozen}):
        yield len(frozen)
