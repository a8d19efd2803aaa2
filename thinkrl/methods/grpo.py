"""GRPO: Group Relative Policy Optimization.

Paper: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv 2402.03300. Exact-from-code reference: verl `compute_policy_loss_vanilla`, TRL loss_type `grpo`.

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    r     = pi_theta(y_t) / pi_old(y_t)
    l_t   = max(-r A_i, -clip(r, 1 - clip_low, 1 + clip_high) A_i)          (PPO clipped surrogate)
    l_t   = min(l_t, -dual_clip A_i)  where A_i < 0                         (optional dual clip)
    l_t  += beta * KL_k3(pi_theta || pi_ref)                                (optional, beta > 0)
    loss  = aggregate(l, mode=aggregation)                                  (seq-mean-token-mean in the paper)

With LoRA the reference model is the base model with the adapters disabled. Defaults: clip 0.2 both sides,
no dual clip, beta 0 (TRL's default; DeepSeekMath used 0.04), seq-mean-token-mean aggregation.
Advantages: (r - mean) / (std + eps) over the group (set by the trainer; see thinkrl/advantages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, clipped_surrogate, dual_clip, k3_kl, log_ratio, masked_mean, reduce


@dataclass
class Config:
    clip_low: float = 0.2
    """Lower clip: the ratio is clipped at 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip: the ratio is clipped at 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip ratio c > 1 for negative advantages (verl uses 3); 0 = off."""
    beta: float = 0.0
    """Coefficient of the k3 KL penalty to the reference model; 0 = no reference model."""
    aggregation: Aggregation = "seq-mean-token-mean"
    """How per-token losses become one scalar (methods.md 1.4)."""
    norm_length: int = 0
    """Constant L for seq-mean-token-sum-norm; 0 = rollout.max_new_tokens."""

    def __post_init__(self) -> None:
        if self.clip_low < 0 or self.clip_high < 0:
            raise ValueError("clip_low and clip_high must be >= 0")
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or 0 = off), got {self.dual_clip}")


@register("grpo")
class GRPO(Method):
    """PPO-clipped surrogate with group-normalised advantages and an optional k3 KL to the reference."""

    Config = Config

    @property
    def requires(self) -> set[str]:
        return {"ref_logp"} if self.cfg.beta > 0 else set()

    def loss(self, batch):
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        ratio = torch.exp(log_ratio(batch.logp, batch.old_logp))  # (B, T)
        per_token, clipped = clipped_surrogate(ratio, adv, c.clip_low, c.clip_high)  # (B, T)
        metrics = {}
        if c.dual_clip:
            per_token, dual = dual_clip(per_token, adv, c.dual_clip)
            metrics["clip/dual_frac"] = masked_mean(dual, mask)
        if c.beta > 0:
            kl = k3_kl(batch.logp, batch.ref_logp)  # (B, T)
            per_token = per_token + c.beta * kl
            metrics["kl/ref"] = masked_mean(kl, mask)
        loss = reduce(per_token, batch, c)
        metrics["clip/frac"] = masked_mean(clipped, mask)
        metrics["clip/low_frac"] = masked_mean(clipped & (ratio < 1), mask)
        metrics["clip/high_frac"] = masked_mean(clipped & (ratio > 1), mask)
        metrics["ratio/mean"] = masked_mean(ratio, mask)
        return loss, metrics
