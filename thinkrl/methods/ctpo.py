"""CTPO: Cumulative Token Policy Optimization.

Paper: "Rethinking Importance Sampling in LLM Policy Optimization: A Cumulative Token Perspective",
arXiv 2605.07331. Exact-from-code reference: horizon-llm/CTPO `verl/trainer/ppo/core_algos.py`
(`_compute_policy_loss_cum_token_la_impl`, loss mode `cum-token-cumprod-la`) and `ctpo.sh`.

The state s_t = (x, y_<t) is itself drawn from the old policy, so the unbiased weight of token t is the
product of the token ratios up to t, not the token ratio alone; stopping at t keeps its variance below that
of the full-sequence ratio. The spread of its log grows like sqrt(t), so the clip bounds, in log space,
grow like n_t^p ("LA", position-adaptive). Objective (minimised), per valid token t, n_t = number of
valid tokens up to and including t (masked tool/observation tokens neither add to the sum nor advance n):

    delta_k = m_k clip(log pi_theta(y_k) - log pi_old(y_k), -20, 20)
    Lambda  = sum_{k<=t} delta_k                 (variant=cumprod)  or that sum / n_t   (variant=geomean)
    log R_t = min(sg(Lambda) + log pi_theta(y_t) - sg(log pi_theta(y_t)), 10)
              (value: log of the prefix product of ratios; gradient only through the current token)
    bounds=log_position:  lo = eps_lo n_t^p,  hi = eps_hi n_t^p,  dual = eps_c n_t^p
              Rbar = exp(clip(log R_t, -lo, hi))
    bounds=ratio:         Rbar = clip(R_t, 1 - ratio_clip, 1 + ratio_clip),  dual = log(ratio_dual_clip)
    l_t     = max(-A R_t, -A Rbar);   A < 0:  l_t = min(l_t, -A exp(dual))      (dual clip)
    loss    = aggregate(l, mode=aggregation)                                    (x TIS weights if enabled)

Defaults (ctpo.sh, verl actor config): eps_lo 0.025, eps_hi 0.05, eps_c 0.05, p 0.5 for cumprod and -0.5
for geomean (p = 0: uniform bounds); ratio windows [0.9753, 1.0513] at t = 1, [0.7788, 1.6487] at 100,
[0.4536, 4.8605] at 1000, [0.1069, 87.54] at 8000; the dual-clip threshold equals the upper bound.
bounds=ratio gives the non-LA modes `cum-token-cumprod` / `cum-token-geomean` (eps 0.2, dual clip c = 3).
GRPO advantages (with std), token-mean, sequence-level TIS with C = 5 in the paper (its recipe).

Relative to grpo: the ratio of token t is the cumulative prefix ratio (prefix detached), the clip window
depends on the token's position, and a position-dependent dual clip caps A < 0 tokens. With all ratios 1
(one update per rollout) it is exactly GRPO with token-mean.
Confidence: EXACT-CODE (docs/methods.md, ctpo) for cumprod with log_position bounds and the non-LA ratio modes.
Interpretation: geomean keeps the current-token gradient coefficient 1 (as GSPO-token does) rather than 1/n_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, Reduction, clip_metrics, dual_clip, log_ratio, masked_mean, reduce, valid_positions

LOG_CUM_MAX = 10.0  # cap on log R_t (the reference code's), so exp cannot overflow on long sequences
DEFAULT_P = {"cumprod": 0.5, "geomean": -0.5}  # spread of a sum grows like sqrt(n), of a mean falls like 1/sqrt(n)


@dataclass
class Config(Reduction):
    variant: Literal["cumprod", "geomean"] = "cumprod"
    """Prefix weight: cumprod = product of the token ratios up to t; geomean = its n_t-th root."""
    bounds: Literal["log_position", "ratio"] = "log_position"
    """log_position = log-space window [-eps_lo n^p, eps_hi n^p] (the paper's LA mode); ratio = [1-ratio_clip, 1+ratio_clip]."""
    eps_lo: float = 0.025
    """Lower log-space bound per unit of n^p (bounds=log_position): log R is clipped at -eps_lo n_t^p."""
    eps_hi: float = 0.05
    """Upper log-space bound per unit of n^p (bounds=log_position): log R is clipped at eps_hi n_t^p."""
    eps_c: float = 0.05
    """Dual clip for A < 0 at ratio exp(eps_c n_t^p) (bounds=log_position); 0 = off."""
    p: float | None = None
    """Position exponent of the bounds, in [-1, 1]; None = 0.5 for cumprod, -0.5 for geomean; 0 = uniform bounds."""
    ratio_clip: float = 0.2
    """Ratio-space clip [1 - ratio_clip, 1 + ratio_clip] (bounds=ratio only)."""
    ratio_dual_clip: float = 3.0
    """Dual-clip ratio c > 1 for A < 0 (bounds=ratio only, verl's default 3); 0 = off."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.p is None:
            self.p = DEFAULT_P[self.variant]
        for name in ("eps_lo", "eps_hi"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 (a log-space bound width), got {getattr(self, name)}")
        if self.eps_c < 0:
            raise ValueError(f"eps_c must be >= 0 (0 = no dual clip), got {self.eps_c}")
        if not -1 <= self.p <= 1:  # |Lambda_t| <= 20 n_t, so bounds growing faster than n_t never bind
            raise ValueError(f"p must be in [-1, 1] (0.5 = sqrt growth, 0 = uniform), got {self.p}")
        if not 0 < self.ratio_clip < 1:
            raise ValueError(f"ratio_clip must be in (0, 1), got {self.ratio_clip}")
        if self.ratio_dual_clip and self.ratio_dual_clip <= 1:
            raise ValueError(f"ratio_dual_clip must be > 1 (or 0 = off), got {self.ratio_dual_clip}")


def cumulative_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, variant: str) -> tuple[Tensor, Tensor]:
    """Detached Lambda_t (0 at mask == 0) and the valid-token position n_t >= 1, both (B, T)."""
    m = mask.to(logp.dtype)  # (B, T)
    delta = log_ratio(logp.detach(), old_logp) * m  # (B, T) masked tokens add exactly 0 to the prefix
    lam = delta.cumsum(-1)  # (B, T)
    n = valid_positions(mask).clamp(min=1).to(lam.dtype)  # (B, T) masked tokens do not advance n
    if variant == "geomean":
        lam = lam / n
    return lam * m, n


def log_bounds(n: Tensor, cfg: Config) -> tuple[Tensor, Tensor, Tensor | None]:
    """Log-space clip window (lower < 0 < upper) and dual-clip log-threshold (None = off), each like n."""
    if cfg.bounds == "log_position":
        assert cfg.p is not None  # filled in by Config.__post_init__
        scale = n**cfg.p  # (B, T) n_t^p, 1 everywhere for p = 0
        dual = cfg.eps_c * scale if cfg.eps_c else None
        return -cfg.eps_lo * scale, cfg.eps_hi * scale, dual
    ones = torch.ones_like(n)  # (B, T)
    dual = math.log(cfg.ratio_dual_clip) * ones if cfg.ratio_dual_clip else None
    return math.log(1 - cfg.ratio_clip) * ones, math.log(1 + cfg.ratio_clip) * ones, dual


@register("ctpo")
class CTPO(Method[Config]):
    """Cumulative prefix importance ratio (gradient through the current token) with sqrt(position) log-space clip."""

    # the paper's regime scaled to one machine (its ctpo.sh: 512 prompts x 8 in mini-batches of 32): several updates
    # per rollout, here 2 prompts x 16 in 4 mini-batches of 8, so pi drifts from pi_old; sequence-level TIS with C = 5
    recipe = {
        "rollout.group_size": 16,
        "train.mini_batches": 4,
        "correction.mode": "tis",
        "correction.level": "sequence",
        "correction.c_max": 5.0,
    }
    acts_off_policy = True

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        lam, n = cumulative_log_ratio(batch.logp, batch.old_logp, mask, c.variant)  # (B, T)
        # value Lambda_t, gradient of log pi_theta(y_t) alone: the prefix part of the weight is a constant
        log_cum = (lam + batch.logp - batch.logp.detach()).clamp(max=LOG_CUM_MAX)  # (B, T)
        log_cum = torch.where(mask, log_cum, 0.0)  # (B, T)
        cum = torch.exp(log_cum)  # (B, T) R_t
        lo, hi, dual = log_bounds(n, c)  # (B, T)
        unclipped = -adv * cum  # (B, T)
        clipped = -adv * torch.exp(torch.clamp(log_cum, lo, hi))  # (B, T) constant in theta where clipped
        per_token = torch.maximum(unclipped, clipped)  # (B, T)
        metrics = clip_metrics(clipped > unclipped, cum.detach(), mask, ratio_key="ratio/cum_mean")
        if dual is not None:
            per_token, hit = dual_clip(per_token, adv, torch.exp(dual))  # (B, T) cap -A exp(dual) for A < 0
            metrics["clip/dual_frac"] = masked_mean(hit, mask)
        log_cum = log_cum.detach()
        metrics["ratio/log_cum_mean"] = masked_mean(log_cum, mask)
        metrics["ratio/log_cum_abs_max"] = torch.where(mask, log_cum.abs(), 0.0).amax()
        return reduce(per_token, batch, c), metrics
