"""GRPO: Group Relative Policy Optimization.

Paper: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
arXiv 2402.03300. Exact-from-code reference: verl `compute_policy_loss_vanilla`, TRL loss_type `grpo`.

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    r     = pi_theta(y_t) / pi_old(y_t)
    l_t   = max(-r A_i, -clip(r, 1 - clip_low, 1 + clip_high) A_i)          (PPO clipped surrogate)
    l_t   = min(l_t, -dual_clip A_i)  where A_i < 0                         (optional dual clip)
    k_t   = beta * KL_k3(pi_theta || pi_ref)                                (optional, beta > 0)
    loss  = aggregate(w l + k, mode=aggregation)                            (seq-mean-token-mean in the paper)

w is the trainer's rollout-correction weight (TIS/MIS, `correction.mode`; 1 when off). It multiplies the
policy term only, as in verl (workers/utils/losses.py) and TRL: the surrogate estimates the policy gradient
from tokens mu sampled, which is what pi_old / mu corrects, while the KL term is a regulariser on pi_theta
itself. Weighting it would let MIS switch the penalty off (w = 0) exactly where the sampler disagrees most.

With LoRA the reference model is the base model with the adapters disabled. Defaults: clip 0.2 both sides,
no dual clip, beta 0 (TRL's default; DeepSeekMath used 0.04), seq-mean-token-mean aggregation.
Advantages: (r - mean) / (std + eps) over the group (set by the trainer; see thinkrl/learner/advantages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import ClipConfig, clipped_loss, k3_kl, log_ratio, masked_mean, reduce


@dataclass
class Config(ClipConfig):
    beta: float = 0.0
    """Coefficient of the k3 KL penalty to the reference model; 0 = no reference model."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0 (0 = no KL term), got {self.beta}")


@register("grpo")
class GRPO(Method[Config]):
    """PPO-clipped surrogate with group-normalised advantages and an optional k3 KL to the reference."""

    @property
    def requires(self) -> set[str]:
        return {"ref_logp"} if self.cfg.beta > 0 else set()

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c = self.cfg
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, c)  # (B, T)
        penalty = None
        if c.beta > 0:
            assert batch.ref_logp is not None  # listed in requires
            kl = k3_kl(batch.logp, batch.ref_logp)  # (B, T)
            penalty = c.beta * kl  # (B, T) added after the correction weights: a regulariser, not an estimate under mu
            metrics["kl/ref"] = masked_mean(kl, batch.mask)
        return reduce(per_token, batch, c, unweighted=penalty), metrics
