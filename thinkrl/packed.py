"""Linear layers whose weights are laid out once for oneDNN's CPU matmul ("packed"), for weights that stay
fixed while they are used many times: a sampling copy over one generation call, a frozen LoRA base over one
update phase.

Why: torch's default CPU matmul for float32 goes through MKL's sgemm with the weight in its plain (out, in)
layout. Measured on this project's 2-core AMD EPYC (bench/RESULTS.md names the machine), oneDNN with the
weight reordered into its own blocked layout ran the decoder's matmuls 3.6x faster at 16 rows (a whole
SmolLM2 decode step's matmuls: 129 ms -> 35 ms) and 1.2-1.5x faster at 640-2,048 rows, with float32 results
that differ from F.linear's only by summation order (about 1e-6 relative). Reordering costs about one copy of
the weights (0.3 s for 135M parameters here), so it pays only when a weight is used for many calls.

On CUDA, without oneDNN, or for a dtype it does not pack, `PackedLinear` is plain F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def can_pack(weight: Tensor) -> bool:
    """True where oneDNN can pack this weight: a CPU float32/bfloat16 matrix, with the ops in this torch build."""
    return (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


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
