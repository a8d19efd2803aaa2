"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1).

Paper: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", arXiv 2506.13585.
Exact-from-code reference: verl `compute_policy_loss_cispo`, TRL loss_type `cispo`.
Confidence: EXACT-CODE (docs/methods.md, cispo).

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    r     = pi_theta(y_t) / pi_old(y_t)
    w_t   = sg(clip(r, 1 - clip_low, 1 + clip_high))                   (truncated IS weight, no gradient)
    l_t   = -w_t A_i log pi_theta(y_t)
    loss  = sum_i sum_t l_t / sum_i |y_i|                               (token-mean over the whole batch)

The gradient of a token is -w_t A_i grad log pi_theta(y_t): REINFORCE with a truncated, detached weight.
The loss VALUE is not meaningful (it is a weighted sum of log-probs, not an objective estimate); watch the
gradient and the clip metrics instead.

What it changes relative to grpo: grpo clips the surrogate, so a token whose ratio left the trust region
(in the direction its advantage pushes) gets exactly zero gradient; CISPO clips the weight instead, so
every token keeps a gradient, the weight only bounds its size. clip/frac here counts truncated weights,
not dropped tokens. No KL, no dual clip.

Defaults (the verl example): clip_low 10 (lower bound 1 - 10 < 0, i.e. no lower bound, as in the paper),
clip_high 0.2, i.e. weight cap 1.2; token-mean; group-normalised advantages. Parameterisations differ
(docs/methods.md, cispo):
- paper: no lower bound, only the upper epsilon tuned (clip_low >= 1 here);
- verl example: clip_ratio_low=10, clip_ratio_high=0.2 -> cap 1.2 (these defaults);
- TRL: epsilon_high is an absolute cap on the weight, e.g. 5.0 in the ScaleRL recipe; the same here is
  clip_high=4.0 (cap 1 + 4.0 = 5.0).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, Reduction, clip_metrics, log_ratio, reduce


@dataclass
class Config(Reduction):
    clip_low: float = 10.0
    """The weight is clipped below at 1 - clip_low; any value >= 1 means no lower bound (the paper's choice)."""
    clip_high: float = 0.2
    """The weight is clipped above at 1 + clip_high (TRL's absolute cap 5.0 is clip_high=4.0)."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.clip_low >= 0 and self.clip_high >= 0):
            raise ValueError(f"clip_low and clip_high must be >= 0, got {self.clip_low} and {self.clip_high}")


@register("cispo")
class CISPO(Method[Config]):
    """REINFORCE with a clipped, detached IS weight (cap 1.2): no token ever loses its gradient."""

    acts_off_policy = True

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c = self.cfg
        ratio = log_ratio(batch.logp, batch.old_logp).exp().detach()  # (B, T) the weight carries no gradient
        truncated = (ratio < 1.0 - c.clip_low) | (ratio > 1.0 + c.clip_high)  # (B, T)
        weight = ratio.clamp(1.0 - c.clip_low, 1.0 + c.clip_high)  # (B, T)
        # the value is a weighted log-prob sum, meaningless by itself; the gradient -w A grad log pi is the point
        per_token = -weight * batch.advantages * batch.logp  # (B, T)
        return reduce(per_token, batch, c), clip_metrics(truncated, ratio, batch.mask)
