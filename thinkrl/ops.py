"""Tensor helpers shared by the policy losses (thinkrl/methods/) and the trainer: masked statistics,
clamped log-ratios, valid-token positions, the JS divergence. Pure functions of tensors; nothing here knows
about models, configs or methods.

Shapes follow thinkrl/batch.py: B sequences, T completion positions, V vocabulary; a mask is (B, T) bool.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG_RATIO_LIMIT = 20.0  # clamp log-ratios before exp, as verl does, so one token cannot overflow


def log_ratio(logp: Tensor, other: Tensor) -> Tensor:
    """log(pi / other), clamped to [-20, 20].  # (B, T)"""
    return (logp - other).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask == 1 positions of this (micro-)batch, detached; 0 when empty."""
    x = torch.where(mask, x.detach().float(), 0.0)
    return x.sum() / mask.sum().clamp(min=1)


def valid_positions(mask: Tensor) -> Tensor:
    """n_t = number of mask == 1 tokens at or before t (1-indexed on valid tokens).  # (B, T)

    Padding and tool/observation tokens do not advance the count; at mask == 0 positions the value is the
    count so far, so callers multiply by the mask where it matters.
    """
    return mask.long().cumsum(-1)


def exclusive_cumsum(x: Tensor) -> Tensor:
    """Prefix sums that stop before t: out[..., t] = sum_{j<t} x[..., j], out[..., 0] = 0.  # (B, T)"""
    return torch.cat([torch.zeros_like(x[..., :1]), x.cumsum(-1)[..., :-1]], dim=-1)


def masked_quantile(x: Tensor, mask: Tensor, q: float, dim: int | None = None) -> Tensor:
    """The q-quantile of x over mask == 1 entries, detached, by torch.quantile's default rule (linear).

    dim None: one value over the whole tensor (0-dim); dim -1: one value per row (B,), each over that
    row's own valid entries. Rank q (n - 1) is interpolated between its neighbours with torch.lerp, as
    torch.quantile does, without torch.quantile's 2**24-element limit or its lack of a mask. An empty
    selection gives 0. Entries at mask == 0 are never read, so junk there cannot leak in.
    """
    if dim not in (None, -1):
        raise ValueError("masked_quantile: dim must be None or -1")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"masked_quantile: q must be in [0, 1], got {q}")
    x = x.detach().float()
    if dim is None:
        x, mask = x.reshape(1, -1), mask.reshape(1, -1)
    n = mask.sum(-1)  # (R,)
    ordered = torch.where(mask, x, torch.inf).sort(-1).values  # (R, N) valid entries first, ascending
    last = (n - 1).clamp(min=0)  # (R,)
    rank = q * last.to(x.dtype)  # (R,)
    below = rank.long()  # floor: rank >= 0
    above = torch.minimum(below + 1, last)  # (R,)
    lo = ordered.gather(-1, below[:, None]).squeeze(-1)  # (R,)
    hi = ordered.gather(-1, above[:, None]).squeeze(-1)  # (R,)
    out = torch.where(n > 0, torch.lerp(lo, hi, rank - below.to(x.dtype)), 0.0)  # (R,)
    return out[0] if dim is None else out


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence over the last dim, natural log, 0 log 0 = 0: (..., V), (..., V) -> (...).

    Broadcasts, so js_divergence(probs (N, V), mean (V,)) is each row's divergence to the mean (N,).
    """
    m = 0.5 * (p + q)
    # xlogy(0, .) = 0: a zero entry of p (or q) contributes nothing, even where m is 0 too
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)  # (...)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)  # (...)
    return (0.5 * (kl_pm + kl_qm)).clamp(0.0, math.log(2.0))  # rounding can step just outside [0, ln 2]
