"""Clip-Cov: detach the gradient of a few tokens whose log-prob and advantage covary most.

Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617.
Exact-from-code reference: verl 0.9.1 `compute_policy_loss_clip_cov` (adapted there from the paper's code).
Confidence: EXACT-CODE for the loss; the defaults are verl's (docs/methods.md, clip_cov).

The paper shows that under policy-gradient updates the entropy falls in proportion to the covariance of a
token's log-prob and its advantage: confident tokens with high advantage drive the collapse. Clip-Cov removes
the gradient of a small random share of exactly those tokens. Objective (minimised), per token t:

    r      = pi_theta(y_t) / pi_old(y_t)
    l_t    = max(-r A_t, -clip(r, 1 - clip_low, 1 + clip_high) A_t)           (GRPO's clipped surrogate)
    cov_t  = (A_t - mean A)(log pi_theta(y_t) - mean log pi_theta)            (means over the batch's tokens)
    C      = the tokens with cov_lb < cov_t < cov_ub that the PPO clip left alone
    D      = min(max(1, floor(clip_ratio N)), |C|) tokens drawn from C at random (N valid tokens)
    loss   = aggregate(l_t [t not in D], token-mean)

Batch statistics: the means, N and the draw span the whole mini-batch (every process's part), so
`batch_statistics` is set and the trainer passes each mini-batch in one call; verl computes them per micro-batch
and per data-parallel rank, which equals this with one micro-batch on one process. The draw: the candidates
with the smallest of the trainer's per-token U(0, 1) numbers (batch.uniform, the same whatever the batching or
process count, and after --resume), a uniformly random subset as verl's torch.randperm draw is, but not the
same subset for the same seed.

What it changes relative to grpo: about clip_ratio of the tokens (2 in 10,000; at least one per mini-batch)
lose their gradient even on-policy; `cov/frac` logs the share dropped and `clip/frac` the PPO clip's.
Defaults: clip_ratio 2e-4, cov_lb 1, cov_ub 5, clip 0.2 both sides, token-mean (verl's, from the paper's code).
Recipe: 4 mini-batches per rollout, so the PPO clip that Clip-Cov works beside acts too (a count chosen as for
the other ratio methods, not copied from the paper's runs); kl_cov has the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import (
    Aggregation,
    ClipConfig,
    batch_covariance,
    clipped_loss,
    local_tokens,
    log_ratio,
    masked_mean,
    reduce,
)


@dataclass
class Config(ClipConfig):
    clip_ratio: float = 2e-4
    """Share of the batch's valid tokens whose gradient is detached (at least one token)."""
    cov_lb: float = 1.0
    """Only tokens with covariance above this are candidates."""
    cov_ub: float = 5.0
    """Only tokens with covariance below this are candidates."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.clip_ratio <= 1:
            raise ValueError(f"clip_ratio must be in (0, 1], got {self.clip_ratio}")
        if not self.cov_lb < self.cov_ub:
            raise ValueError(f"cov_lb must be below cov_ub, got {self.cov_lb} and {self.cov_ub}")


@register("clip_cov")
class ClipCov(Method[Config]):
    """GRPO clip, plus the gradient of a random 2e-4 of the tokens with covariance in (1, 5) detached."""

    recipe = {"train.mini_batches": 4}  # the paper's PPO-style updates: its candidates exclude what the clip removed
    reinforce_on_policy = False  # the drawn tokens drop out of the on-policy gradient
    batch_statistics = True  # covariance means, token count and the draw span the whole mini-batch

    @property
    def requires(self) -> set[str]:
        return {"uniform"}

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, clipped, metrics = clipped_loss(ratio, batch, c)  # (B, T)
        # one U(0, 1) per token: the trainer's (batch.uniform), else drawn here (a direct call)
        g = batch.generator  # the trainer's sampling generator lives on the device: draw where it lives
        u = batch.uniform if batch.uniform is not None else torch.rand(mask.shape, generator=g, device=g.device if g else mask.device)
        cov, offset, (clipped_all, u_all) = batch_covariance(batch, clipped, u.to(mask.device))  # (N,) each
        candidates = (clipped_all == 0) & (cov > c.cov_lb) & (cov < c.cov_ub)  # (N,)
        count = min(max(int(c.clip_ratio * cov.numel()), 1), int(candidates.sum()))
        drawn = torch.topk(torch.where(candidates, -u_all, -2.0), count).indices  # (count,) the smallest draws
        dropped = local_tokens(drawn, offset, mask)  # (B, T)
        per_token = torch.where(dropped, 0.0, per_token)  # (B, T) no value, no gradient
        metrics["cov/frac"] = masked_mean(dropped, mask)
        return reduce(per_token, batch, c), metrics
