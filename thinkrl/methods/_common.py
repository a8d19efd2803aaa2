"""Pieces shared by the policy losses: ratios, the clipped surrogate, KL, aggregation.

Notation (see thinkrl/batch.py): B sequences, T completion positions. Every per-token tensor is (B, T)
and has already been zero-filled at mask == 0 positions by TokenBatch, so nothing here can leak junk from
padding into the loss or the gradient.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

LOG_RATIO_LIMIT = 20.0  # clamp log-ratios before exp, as verl does, so one token cannot overflow


def log_ratio(logp: Tensor, other: Tensor) -> Tensor:
    """log(pi / other), clamped to [-20, 20].  # (B, T)"""
    return (logp - other).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def clipped_surrogate(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """PPO per-token loss max(-r A, -clip(r, 1-lo, 1+hi) A) and where the clipped branch won.

    When the clipped branch is the max its value is constant in r, so that token's gradient is exactly 0.
    """
    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def dual_clip(per_token: Tensor, adv: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """For A < 0 cap the loss at -c A (ratio c), verl's dual clip; returns the loss and where it applied."""
    cap = -adv * c  # (B, T)
    hit = (adv < 0) & (per_token > cap)
    return torch.where(hit, cap, per_token), hit


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || ref): ref/pi - log(ref/pi) - 1, clamped to [-10, 10].  # (B, T)"""
    d = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: Aggregation,
    num_tokens: int,
    num_seqs: int,
    norm_length: int | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar (methods.md 1.4).

    num_tokens / num_seqs are global counts over the whole update batch, so summing the results of
    micro-batches reproduces the full-batch value exactly, however the batch was split.
    """
    per_token = torch.where(mask, per_token, 0.0)  # (B, T)
    if mode == "token-mean":
        return per_token.sum() / max(num_tokens, 1)
    if mode == "seq-mean-token-mean":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
        return per_seq.sum() / max(num_seqs, 1)
    if mode == "seq-mean-token-sum":
        return per_token.sum() / max(num_seqs, 1)
    if mode == "seq-mean-token-sum-norm":
        if not norm_length:
            raise ValueError("seq-mean-token-sum-norm needs norm_length (the constant L)")
        return per_token.sum() / (max(num_seqs, 1) * norm_length)
    raise ValueError(f"unknown aggregation {mode!r}")


def reduce(per_token: Tensor, batch, cfg) -> Tensor:
    """The last line of every method: apply rollout-correction weights, then aggregate.

    `batch.is_weights` (TIS/MIS, set by the trainer from the `correction` config) multiplies the per-token
    loss, so the correction works with any method; `cfg.aggregation` and `cfg.norm_length` pick the mode.
    """
    if batch.is_weights is not None:
        per_token = per_token * batch.is_weights
    return aggregate(per_token, batch.mask, cfg.aggregation, batch.num_tokens, batch.num_seqs, getattr(cfg, "norm_length", 0) or None)


def check_common(cfg) -> None:
    """Checks every method Config shares: clip widths and the constant L of seq-mean-token-sum-norm >= 0."""
    for name in ("clip_low", "clip_high"):
        value = getattr(cfg, name, None)
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if getattr(cfg, "norm_length", 0) < 0:
        raise ValueError(f"norm_length must be >= 0 (0 = rollout.max_new_tokens), got {cfg.norm_length}")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask == 1 positions of this (micro-)batch, detached; 0 when empty."""
    x = torch.where(mask, x.detach().float(), 0.0)
    return x.sum() / mask.sum().clamp(min=1)


def with_norm_length(cfg, batch):
    """`cfg` with norm_length 0 replaced by the batch's padded length T when the mode needs it.

    The trainer's `resolve()` sets norm_length = rollout.max_new_tokens before any loss runs; this fallback
    only serves direct calls (tests, notebooks), and uses verl's default constant (the padded response
    length). Micro-batches split along B keep T, so the fallback is the same for every part.
    """
    if cfg.aggregation != "seq-mean-token-sum-norm" or getattr(cfg, "norm_length", 0):
        return cfg
    return dataclasses.replace(cfg, norm_length=batch.mask.shape[-1])


def valid_positions(mask: Tensor) -> Tensor:
    """n_t = number of mask == 1 tokens at or before t (1-indexed on valid tokens; methods.md 1.1).  # (B, T)

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
