"""DPPO: Divergence Proximal Policy Optimization.

Paper: "Rethinking the Trust Region in LLM RL", arXiv 2602.04879. Exact-from-code reference: sail-sg/Stable-RL
`_compute_token_mask_for_policy_loss`, verl `compute_policy_loss_dppo_tv` / `compute_policy_loss_dppo_kl`.

Ratio clipping over-restricts rare tokens (1e-5 -> 1e-3 is a ratio of 100) and under-restricts likely ones
(0.99 -> 0.8 stays inside [0.8, 1.2]). DPPO puts the trust region on a divergence of the sampled token's
Bernoulli distribution instead, hard-masks tokens that left it in the advantage-favoured direction, and gives
the kept tokens a REINFORCE gradient with a truncated, detached ratio. Objective (minimised), per token t:

    pi, mu  = pi_theta(y_t), mu(y_t)        mu = behav_logp (anchor=behav, bypass mode) or old_logp (anchor=old)
    r       = pi / mu
    Binary-TV (divergence=tv):  A > 0: keep iff pi - mu <= delta_high;  otherwise: keep iff pi - mu >= -delta_low
    Binary-KL (divergence=kl):  D = mu log(mu/pi) + (1-mu) log((1-mu+1e-8)/(1-pi+1e-8))
                                A > 0: drop iff D > delta_high and pi > mu;  otherwise: drop iff D > delta_low and pi < mu
    l_t     = -A sg(min(r, ratio_cap)) log pi keep        (keep detached; the value of l is meaningless, its gradient
                                                           -A min(r, C) grad log pi is the point)
    loss    = aggregate(l, mode=aggregation)              (seq-mean-token-sum-norm, L = rollout.max_new_tokens)

A token moving against its advantage (pi falling under A > 0, rising under A < 0) is never masked. Inside the
region the gradient is that of the IS surrogate -A r; with delta_high = delta_low = 1 (tv) nothing is masked.

Defaults (verl example run_qwen30b_dppo.sh): tv with delta 0.15 on both sides; kl with 0.05 on both sides
(delta_low/delta_high = None pick these by divergence); ratio_cap 10 (Stable-RL code default; the verl example
disables truncation with 1e4); anchor=behav (bypass mode); Dr.GRPO advantages (no std); seq-mean-token-sum-norm.
The Top-K variant (divergence over the top-K vocabulary entries) is not implemented.

Relative to grpo: the ratio is taken against mu, not pi_old; the clip is replaced by a divergence mask; the
surviving tokens get a detached truncated ratio times log pi (CISPO-like) instead of the clipped surrogate.
With anchor=behav the ratio already corrects each token from mu, so correction.mode tis / mis (a second
weight pi_old / mu) is refused when the config is resolved; with anchor=old the ratio is against pi_old and
the correction bridges mu -> pi_old (thinkrl/learner/correction.py).
Confidence: EXACT-CODE (docs/methods.md, dppo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, AnchoredConfig, anchored_ratio, log_ratio, masked_mean, reduce

DEFAULT_DELTA = {"tv": 0.15, "kl": 0.05}  # verl run_qwen30b_dppo.sh, both sides


@dataclass
class Config(AnchoredConfig):
    divergence: Literal["tv", "kl"] = "tv"
    """Trust region: tv = Binary-TV |pi - mu|, kl = Binary-KL of the sampled token's Bernoulli."""
    delta_low: float | None = None
    """Threshold on the side where pi falls (A <= 0); None = 0.15 for tv, 0.05 for kl."""
    delta_high: float | None = None
    """Threshold on the side where pi rises (A > 0); None = 0.15 for tv, 0.05 for kl."""
    ratio_cap: float = 10.0
    """Truncation C of the detached ratio min(pi/mu, C) (Stable-RL default 10; 1e4 = off, as in verl's example)."""
    aggregation: Aggregation = "seq-mean-token-sum-norm"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.delta_low is None:
            self.delta_low = DEFAULT_DELTA[self.divergence]
        if self.delta_high is None:
            self.delta_high = DEFAULT_DELTA[self.divergence]
        for name in ("delta_low", "delta_high"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
            if self.divergence == "tv" and value > 1:  # a TV distance between Bernoullis never exceeds 1
                raise ValueError(f"{name} must be in (0, 1] with divergence=tv (1 = never mask), got {value}")
        if not self.ratio_cap > 0:
            raise ValueError(f"ratio_cap must be > 0, got {self.ratio_cap}")


@register("dppo")
class DPPO(Method[Config]):
    """Divergence trust region (Binary-TV or Binary-KL on pi - mu) with a truncated IS REINFORCE gradient."""

    recipe = {
        "rollout.group_size": 16,
        "train.mini_batches": 4,
    }  # off-policy updates: 4 mini-batches per rollout of 16 completions per prompt
    acts_off_policy = True

    advantage = "no_std"

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        assert c.delta_low is not None and c.delta_high is not None  # filled in by Config.__post_init__
        ratio, anchor = anchored_ratio(batch, c)  # (B, T) pi_theta / mu, log mu
        with torch.no_grad():  # the trust region is a gate, never part of the gradient
            pi, mu = batch.logp.detach().float().exp(), anchor.float().exp()  # (B, T)
            if c.divergence == "tv":
                shift = pi - mu  # (B, T)
                keep = torch.where(adv > 0, shift <= c.delta_high, shift >= -c.delta_low)  # (B, T)
            else:
                # mu log(mu/pi) uses the clamped log-ratio; 1e-8 keeps the second log finite at pi or mu = 1
                kl = -mu * log_ratio(batch.logp.detach(), anchor) + (1 - mu) * torch.log((1 - mu + 1e-8) / (1 - pi + 1e-8))  # (B, T)
                keep = torch.where(adv > 0, (kl <= c.delta_high) | (pi <= mu), (kl <= c.delta_low) | (pi >= mu))  # (B, T)
            weight = ratio.detach().clamp(max=c.ratio_cap)  # (B, T)
        per_token = -adv * weight * batch.logp * keep  # (B, T)
        loss = reduce(per_token, batch, c)
        metrics = {
            "mask/frac": masked_mean(~keep, mask),
            "ratio/mean": masked_mean(ratio, mask),
            "ratio/trunc_frac": masked_mean(ratio.detach() > c.ratio_cap, mask),
        }
        return loss, metrics
