"""Pieces shared by the policy losses: ratios, the clipped surrogate, KL, aggregation.

Notation (see thinkrl/batch.py): B sequences, T completion positions. Every per-token tensor is (B, T)
and has already been zero-filled at mask == 0 positions by TokenBatch, so nothing here can leak junk from
padding into the loss or the gradient.
"""

from __future__ import annotations

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


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask == 1 positions of this (micro-)batch, detached; 0 when empty."""
    x = torch.where(mask, x.detach().float(), 0.0)
    return x.sum() / mask.sum().clamp(min=1)
