"""CPPO: position-weighted Binary-TV trust region with a cumulative prefix budget.

Paper: "Beyond Uniform Token-Level Trust Region in LLM Reinforcement Learning", arXiv 2606.10968.
Exact-from-code reference: Tencent-Hunyuan/UniRL `unirl/algorithms/cppo.py` (paper Eq. 8-11 and 22).

DPPO's Binary-TV mask gives every token the same threshold delta. Errors compound along a sequence, so CPPO
makes the threshold stricter early (position weight) and tightens it once the prefix has already spent its
divergence budget; updates that move pi back toward mu are always kept. Per sequence, over its T valid
tokens, with t = 1..T counting valid tokens only (padding and masked tokens do not advance t):

    D_t     = |pi_theta(y_t) - mu(y_t)|                      (detached)      r_t = pi_theta / mu  (differentiable)
    w_t     = 1 - (1 - w_min) (t - 1) / (T - 1)              (w_1 = 1, w_T = w_min; w_1 = 1 when T = 1)
    Z_t     = w_t D_t,   S_{t-1} = sum_{j<t} Z_j,   W_{t-1} = sum_{j<t} w_j     (S_0 = W_0 = 0)
    b       = clip(P90(D_1..T), b_min, 2 b_min)              (per-sequence budget; P90 = torch.quantile linear)
    c_t     = min(delta, delta + b W_{t-1} - S_{t-1})
    keep_t  = [A (r_t - 1) <= 0]  or  [Z_t <= c_t]           (detached)
    l_t     = -A r_t keep_t                                   (no truncation, no detach of r)
    loss    = aggregate(l, mode=aggregation)

The prefix sums run over all tokens of the sequence, kept or not (UniRL), so masking a token does not refund
its divergence. Defaults: delta 0.15 (dense models; 0.20 for Qwen3-30B-A3B), w_min 0.8, b_min 0.02,
mu = the sampler's log-probs (anchor=behav; old = pi_old, UniRL's "replay" ablation), Dr.GRPO advantages
(no std), token-mean (the recipe also uses seq-mean-token-sum-norm).

Relative to grpo: ratio against mu; the clip is replaced by the budgeted divergence mask; the kept tokens use
the plain IS surrogate -A r. All statistics are per sequence, so micro-batching along B changes nothing.
With anchor=behav the ratio already corrects each token from mu, so correction.mode tis / mis (a second
weight pi_old / mu) is refused when the config is resolved; with anchor=old the ratio is against pi_old and
the correction bridges mu -> pi_old (thinkrl/learner/correction.py).
Confidence: EXACT-CODE (docs/methods.md, cppo).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import (
    Aggregation,
    AnchoredConfig,
    anchored_ratio,
    exclusive_cumsum,
    masked_mean,
    masked_quantile,
    reduce,
    valid_positions,
)


@dataclass
class Config(AnchoredConfig):
    delta: float = 0.15
    """Token-level Binary-TV threshold delta (paper: 0.15 dense, 0.20 for Qwen3-30B-A3B)."""
    w_min: float = 0.8
    """Position weight of a sequence's last token; weights fall linearly from 1 at the first."""
    b_min: float = 0.02
    """Floor of the per-sequence prefix budget clip(P90(D), b_min, 2 b_min)."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.delta > 0:
            raise ValueError(f"delta must be > 0, got {self.delta}")
        if not 0 < self.w_min <= 1:
            raise ValueError(f"w_min must be in (0, 1], got {self.w_min}")
        if self.b_min < 0:
            raise ValueError(f"b_min must be >= 0, got {self.b_min}")


def thresholds(dist: Tensor, mask: Tensor, cfg: Config) -> tuple[Tensor, Tensor]:
    """Weighted divergence Z_t and effective threshold c_t of each valid token, both (B, T), 0 at mask == 0."""
    m = mask.to(dist.dtype)  # (B, T)
    pos = valid_positions(mask).to(dist.dtype)  # (B, T) t, counting valid tokens only
    length = m.sum(-1, keepdim=True)  # (B, 1) T of each sequence
    w = (1 - (1 - cfg.w_min) * (pos - 1) / (length - 1).clamp(min=1)) * m  # (B, T)
    z = w * dist * m  # (B, T)
    budget = masked_quantile(dist, mask, 0.9, dim=-1).clamp(cfg.b_min, 2 * cfg.b_min)[:, None]  # (B, 1)
    c = torch.clamp(cfg.delta + budget * exclusive_cumsum(w) - exclusive_cumsum(z), max=cfg.delta) * m  # (B, T)
    return z, c


@register("cppo")
class CPPO(Method[Config]):
    """DPPO-style Binary-TV mask with position-weighted thresholds and a cumulative per-sequence prefix budget."""

    recipe = {
        "rollout.group_size": 16,
        "train.mini_batches": 4,
    }  # off-policy updates: 4 mini-batches per rollout of 16 completions per prompt
    acts_off_policy = True

    advantage = "no_std"

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        ratio, anchor = anchored_ratio(batch, c)  # (B, T) pi_theta / mu, log mu
        with torch.no_grad():  # the trust region is a gate, never part of the gradient
            dist = (batch.logp.detach().float().exp() - anchor.float().exp()).abs()  # (B, T)
            z, thr = thresholds(dist, mask, c)  # (B, T)
            toward_mu = adv * (ratio.detach() - 1) <= 0  # (B, T) moving pi back toward mu is always allowed
            within = z <= thr  # (B, T)
            keep = toward_mu | within  # (B, T)
        per_token = -adv * ratio * keep  # (B, T)
        loss = reduce(per_token, batch, c)
        metrics = {
            "mask/frac": masked_mean(~keep, mask),
            # tokens inside the plain token threshold (Z <= delta) that the prefix budget still masked
            "mask/budget_frac": masked_mean(~keep & (z <= c.delta), mask),
            "ratio/mean": masked_mean(ratio, mask),
        }
        return loss, metrics
