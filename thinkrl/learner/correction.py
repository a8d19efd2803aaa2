"""Rollout-mismatch correction (TIS / MIS / IcePop / IPO's mask) and mismatch diagnostics, for any method.

rho_t = pi_old(y_t) / mu(y_t): how much more likely the trainer's policy finds the token than the sampler
that drew it did (they differ when the sampler runs at another precision, is stale, or is a historical
checkpoint). See docs/off_policy.md:
    tis     w = min(rho, c_max)                                 truncated importance weight
    mis     w = rho * [c_min <= rho <= c_max]                   outliers masked out
    icepop  w = rho * [band[0] <= rho <= band[1]]               per token (Ring-1T's IcePop; verl's lower_upper)
    ipo     w = rho * [|pi_old(y_t) - mu(y_t)| <= eps]          per token, on probabilities (prime-rl's IPO mask)
At sequence level (tis, mis) rho_i = exp(sum_t log rho_it), one weight for all of the sequence's tokens. The
weights are detached and multiply each method's per-token loss (TokenBatch.is_weights, applied by _common.reduce).
The kept tokens of icepop and ipo carry rho, so with any method's ratio pi_theta / pi_old the token is weighted
pi_theta / mu, as in prime-rl's loss (whose ratio is taken against the sampler directly).

A method whose loss already corrects some tokens back to the policy that wrote them declares it
(Method.mismatch_corrected): "all" tokens (dppo, cppo, drpo with anchor=behav, whose ratio is pi_theta / mu;
ais, whose weight is built from pi_old / mu) cannot take pi_old / mu a second time, so `thinkrl.config.load.conflict` refuses
correction.mode tis / mis for them when the config is resolved; "prefix" tokens (thinking_seeds: ratioed
against pi_h, their writer) keep weight 1 and stay out of a sequence's product (`weights(exempt=...)`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.config import CorrectionConfig
from thinkrl.ops import LOG_RATIO_LIMIT


def log_rho(old_logp: Tensor, behav_logp: Tensor, mask: Tensor) -> Tensor:
    """log pi_old - log mu, clamped, 0 at padding.  # (B, T)"""
    return torch.where(mask, (old_logp - behav_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), 0.0)


def weights(old_logp: Tensor, behav_logp: Tensor, mask: Tensor, cfg: CorrectionConfig, exempt: Tensor | None = None) -> Tensor | None:
    """(B, T) detached correction weights, or None when cfg.mode == 'none'. `exempt` (B, T): tokens the method
    already corrects itself; their weight is 1 and they add nothing to a sequence's log rho."""
    if cfg.mode == "none":
        return None
    corrected = mask if exempt is None else mask & ~exempt  # (B, T)
    lr = log_rho(old_logp.detach(), behav_logp, corrected)  # (B, T)
    if cfg.level == "sequence":
        lr = lr.sum(-1, keepdim=True).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).expand_as(lr)  # (B, T)
    rho = lr.exp()  # (B, T)
    if cfg.mode == "tis":
        w = rho.clamp(max=cfg.c_max)
    elif cfg.mode == "mis":
        w = torch.where((rho >= cfg.c_min) & (rho <= cfg.c_max), rho, 0.0)
    elif cfg.mode == "icepop":
        w = torch.where((rho >= cfg.band[0]) & (rho <= cfg.band[1]), rho, 0.0)
    else:  # ipo: a gap in probability, so a rare token may move by a large ratio and a common one may not
        gap = (old_logp.detach().exp() - behav_logp.exp()).abs()  # (B, T)
        w = torch.where(gap <= cfg.eps, rho, 0.0)
    w = torch.where(corrected, w, 1.0)  # (B, T) exempt tokens: 1 even when c_max < 1 or MIS would mask rho = 1
    return torch.where(mask, w, 0.0).detach()


@torch.no_grad()
def mismatch_stats(old_logp: Tensor, behav_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Token-level trainer/sampler mismatch: mean |log rho|, the k3 estimate of KL(mu || pi_old), and the
    fraction of tokens with rho > 2. Zero up to float noise when the sampler is the trainer's policy."""
    lr = log_rho(old_logp, behav_logp, mask)  # (B, T)
    n = mask.sum().clamp(min=1)
    k3 = torch.where(mask, lr.exp() - 1 - lr, 0.0)  # rho - 1 - log rho >= 0
    return {
        "mismatch/abs_log_ratio": lr.abs().sum() / n,
        "mismatch/k3": k3.sum() / n,
        "mismatch/ratio_gt2_frac": ((lr > 0.6931471805599453) & mask).sum() / n,
    }
