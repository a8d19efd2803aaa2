"""A LoRA layer's forward and backward as one operation for the update phase: y = x W^T + b + s (x A^T) B^T
with the frozen base W through its packed copy (packed.py) and the low-rank term added into y in place.

Why: peft makes three temporaries of the layer's full output size (and as many in the backward); on a CPU
each is fresh memory the kernel zero-fills on first touch, which costs more than the arithmetic
(docs/benchmarks.md). Here the forward writes one output and the backward one input gradient, with only
(tokens x rank) temporaries beside them. The value differs from peft's by rounding only. Layers this does not
cover (DoRA and other variants, several active adapters, a LoRA bias, merged or disabled adapters, active
dropout, mixed dtypes, autocast) keep peft's forward. Inside `segment_grads` the backward also keeps A's and
B's gradients split by runs of input rows (one per segment of the batch), which a whole gradient sums over.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch import Tensor

from thinkrl.accel import kept_outputs
from thinkrl.accel.packed import PackedLinear, can_pack, input_grad, kept_packing
from thinkrl.models import forwards_replaced


class _LoRALinear(torch.autograd.Function):
    """x (..., in) -> (..., out). Gradients flow to x, A (r, in) and B (out, r); W is frozen."""

    @staticmethod
    def forward(ctx, x: Tensor, A: Tensor, B: Tensor, base: PackedLinear, W: Tensor, scale: float, tag, wt: PackedLinear | None) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (N, in)
        h = x2 @ A.t()  # (N, r)

        def output() -> Tensor:
            y = base(x2)  # (N, out)
            return y.addmm_(h, B.t(), alpha=scale).view(*x.shape[:-1], y.shape[-1])  # (..., out)

        # in a checkpointed layer whose pass keeps this shape's outputs, the replay takes the forward's
        # (thinkrl/accel/kept_outputs.py); x2 and h, which the backward needs, are recomputed either way
        y = kept_outputs.result(tag, output) if kept_outputs.keeps((x.shape[-1], base.out_features)) else output()
        ctx.save_for_backward(x2, h, A, B)
        ctx.W, ctx.wt, ctx.scale, ctx.shape = W, wt, scale, x.shape
        ctx.segments, ctx.keys = (_segments if _segments is not None and _segments.takes(x, A, B) else None), (id(A), id(B))
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        x2, h, A, B = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # (N, out)
        gh = (g @ B).mul_(ctx.scale)  # (N, r): the gradient reaching A's output
        if ctx.segments is not None:
            gA, gB = ctx.segments.add(ctx.keys, x2, h, g, gh, ctx.scale)
        else:
            gB = (g.t() @ h).mul_(ctx.scale)  # (out, r)
            gA = gh.t() @ x2  # (r, in)
        gx = None
        if ctx.needs_input_grad[0]:  # not for the first layer's inputs, which depend on frozen weights only
            gx = input_grad(g, ctx.W, ctx.wt).addmm_(gh, A).view(ctx.shape)  # (..., in)
        return gx, gA, gB, None, None, None, None, None


class SegmentGrads:
    """Each fused layer's A and B gradients split by segment: the rows (leading dimension) of every input the
    layer sees cut into `n` equal runs, run k being segment k's. For a batch of n independent parts laid out
    in order, equally many rows each (the probe's replicates), that is each part's own gradient: the whole
    one is their sum, so the split costs no more arithmetic than the sum."""

    def __init__(self, n: int) -> None:
        self.n, self.grads, self.seen, self.even = n, {}, set(), True

    def takes(self, x: Tensor, A: Tensor, B: Tensor) -> bool:
        """Whether this call's rows split into the n segments (records the layer's A and B as seen)."""
        self.seen.update((id(A), id(B)))
        ok = x.dim() == 3 and x.shape[0] % self.n == 0  # (rows, positions, in)
        self.even = self.even and ok
        return ok

    def add(self, keys: tuple[int, int], x2: Tensor, h: Tensor, g: Tensor, gh: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        """Adds one call's per-segment gradients of A and B; returns their sums (the layer's whole gradients)."""
        n = self.n
        gA = torch.bmm(gh.reshape(n, -1, gh.shape[-1]).transpose(1, 2), x2.reshape(n, -1, x2.shape[-1]))  # (n, r, in)
        gB = torch.bmm(g.reshape(n, -1, g.shape[-1]).transpose(1, 2), h.reshape(n, -1, h.shape[-1])).mul_(scale)  # (n, out, r)
        for key, part in zip(keys, (gA, gB)):
            self.grads[key] = self.grads[key].add_(part) if key in self.grads else part  # a layer called twice (prompt, completions)
        return gA.sum(0), gB.sum(0)

    def covers(self, params: list[Tensor]) -> bool:
        """Whether every one of `params` went through a fused layer, in calls that split evenly."""
        return self.even and all(id(p) in self.seen for p in params)

    def flat(self, params: list[Tensor]) -> Tensor:
        """Each segment's gradient of `params`, flattened in their order; then cleared for the next backward.  (n, P)"""
        got = [self.grads.get(id(p)) for p in params]  # None: a parameter the loss does not reach
        out = torch.cat([g.reshape(self.n, -1) if g is not None else p.new_zeros(self.n, p.numel()) for g, p in zip(got, params)], 1)
        self.grads = {}
        return out


_segments: SegmentGrads | None = None


@contextlib.contextmanager
def segment_grads(n: int) -> Iterator[SegmentGrads]:
    """Inside the block, fused layers keep their A and B gradients split into n segments (SegmentGrads)."""
    global _segments
    _segments = SegmentGrads(n)
    try:
        yield _segments
    finally:
        _segments = None


def _adapter(m, x: Tensor, base: PackedLinear, args: tuple, kwargs: dict) -> str | None:
    """The one adapter this call can fuse, or None when peft's own forward must run."""
    active = list(getattr(m, "active_adapters", []))
    if args or kwargs or m.disable_adapters or m.merged or len(active) != 1 or torch.is_autocast_enabled(x.device.type):
        return None
    name = active[0]
    if name not in m.lora_A or name in getattr(m, "lora_variant", {}) or getattr(m, "use_dora", {}).get(name, False):
        return None
    A, B, drop = m.lora_A[name], m.lora_B[name], m.lora_dropout[name]
    if B.bias is not None or (isinstance(drop, torch.nn.Dropout) and drop.training and drop.p > 0):
        return None
    if not (x.dtype == A.weight.dtype == B.weight.dtype == base.weight.dtype == m.base_layer.weight.dtype):
        return None
    return name


def _fused_forward(m, base: PackedLinear, plain, wt: PackedLinear | None):
    def forward(x: Tensor, *args, **kwargs) -> Tensor:
        name = _adapter(m, x, base, args, kwargs)
        if name is None:
            return plain(x, *args, **kwargs)
        A, B = m.lora_A[name].weight, m.lora_B[name].weight
        return _LoRALinear.apply(x, A, B, base, m.base_layer.weight.detach(), m.scaling[name], m, wt)

    return forward


def _lora_linears(model: torch.nn.Module) -> list:
    from peft.tuners.lora import Linear  # peft's plain-Linear LoRA layer (not its quantised or conv ones)

    def frozen_packable(base) -> bool:
        return type(base) is torch.nn.Linear and not base.weight.requires_grad and can_pack(base.weight)

    return [m for m in model.modules() if type(m) is Linear and frozen_packable(m.base_layer)]


@contextlib.contextmanager
def fused_lora_layers(model: torch.nn.Module, rows: int, transposed: bool = False) -> Iterator[int]:
    """Inside the block every peft LoRA Linear of `model` whose frozen base oneDNN can pack runs as one fused
    operation (falling back to peft's forward for a call it does not cover); the packed base is the one
    packed.py keeps on the module, and with `transposed` the input gradient runs through a packed W^T kept
    beside it. Yields how many layers were replaced."""
    layers = _lora_linears(model)

    def fused(m):
        wt = kept_packing(m.base_layer, rows, True) if transposed else None
        return _fused_forward(m, kept_packing(m.base_layer, rows), m.forward, wt)

    with forwards_replaced({m: fused(m) for m in layers}):
        yield len(layers)


def lora_shapes(model: torch.nn.Module) -> Counter:
    """How many LoRA Linear layers of each (in_features, out_features) the fused path covers in `model`: what
    a checkpointed pass can keep the outputs of (thinkrl/accel/kept_outputs.py)."""
    return Counter((m.in_features, m.out_features) for m in _lora_linears(model))
