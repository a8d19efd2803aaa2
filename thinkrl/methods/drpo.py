"""DRPO: Divergence Regularized Policy Optimization.

Paper: "Rethinking the Divergence Regularization in LLM RL", arXiv 2606.09821. Exact-from-code reference:
Tencent-Hunyuan/UniRL `unirl/algorithms/drpo.py::_drpo_loss`, `DRPO/README.md` (paper Eq. 8/9, Table 1),
`DRPO/config.yaml`.

DPPO's Binary-TV trust region |pi - mu| <= delta is the token-adaptive ratio bound |r - 1| <= delta / mu.
DRPO keeps that geometry but replaces the hard mask by a smooth, advantage-weighted quadratic penalty in
probability space (SPO's penalty with the token-adaptive epsilon; unlike a chi^2 penalty it stays bounded
for rare tokens). Objective (minimised), per token t:

    r_t   = exp(clip(log pi_theta(y_t) - log mu(y_t), -20, 20))     (differentiable: no detach, no truncation)
    mu_t  = exp(log mu(y_t))                                         (detached)
    l_t   = -A r_t + |A| / (2 delta) mu_t (r_t - 1)^2
    loss  = aggregate(l, mode=aggregation)                           (x rollout-correction weights if enabled)

Its gradient (paper Eq. 9) is d l_t / d log pi_theta = -A r_t w_t with
    w_t = 1 - sign(A (r_t - 1)) |pi_theta - mu| / delta  in [1 - 1/delta, 1 + 1/delta]:
updates that diverge from mu in the advantage's direction are shrunk (w = 0 exactly at |pi - mu| = delta,
corrective beyond it), and updates that move back toward mu are boosted. As delta -> infinity the penalty
vanishes and l_t = -A r_t, the plain IS surrogate. Since |pi - mu| <= 1, delta = 12.5 keeps w in
[0.92, 1.08]; the zero / corrective regime needs delta < 1.

Defaults: delta 12.5 (paper section 4; delta 2.5 behaves alike), mu = the sampler's log-probs (anchor=behav,
bypass mode), Dr.GRPO advantages (no std), token-mean (the code default; the paper's recipe uses
seq-mean-token-sum-norm with L = max response length, set by its recipe). The sampling temperature must
equal the one the log-probs are computed at (thinkrl uses rollout.temperature for both).

Relative to grpo: the ratio is taken against mu, not pi_old; there is no clip, every token keeps a
gradient, scaled by the bounded weight w_t instead of being cut to zero outside a window.
With anchor=behav the ratio already corrects each token from mu, so correction.mode tis / mis (a second
weight pi_old / mu) is refused when the config is resolved; with anchor=old the ratio is against pi_old and
the correction bridges mu -> pi_old (thinkrl/learner/correction.py).
Confidence: EXACT-CODE + EXACT-PAPER (docs/methods.md, drpo) for anchor=behav; anchor=old (pi_old, UniRL's
"replay" ablation) is offered as an option, as for cppo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, AnchoredConfig, anchored_ratio, masked_mean, reduce


@dataclass
class Config(AnchoredConfig):
    allow_inf: ClassVar[tuple[str, ...]] = ("delta",)  # inf = no penalty (config/typecheck.py refuses inf elsewhere)
    delta: float = 12.5
    """Regularisation threshold delta > 0 on |pi - mu| (paper 12.5; < 1 reaches the corrective regime; inf = no penalty)."""
    aggregation: Aggregation = "token-mean"
    """How per-token losses become one scalar (the paper's recipe: seq-mean-token-sum-norm)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.delta > 0:  # also rejects nan
            raise ValueError(f"delta must be > 0 (inf = no penalty), got {self.delta}")


@register("drpo")
class DRPO(Method[Config]):
    """Differentiable IS surrogate against mu with a smooth |A|/(2 delta) mu (r-1)^2 divergence penalty."""

    recipe = {
        "method.aggregation": "seq-mean-token-sum-norm",
        "rollout.group_size": 16,
        "train.mini_batches": 4,
    }  # the paper's recipe: token sums over a constant length, 4 mini-batches per rollout
    acts_off_policy = True

    advantage = "no_std"

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        ratio, anchor = anchored_ratio(batch, c)  # (B, T) pi_theta / mu, log mu differentiable, as the paper's gradient needs
        mu = anchor.exp()  # (B, T) detached: anchor carries no grad
        # mu (r - 1)^2 = (pi - mu)^2 / mu: a squared probability shift, so rare tokens are not blown up
        penalty = adv.abs() / (2 * c.delta) * mu * (ratio - 1) ** 2  # (B, T)
        per_token = -adv * ratio + penalty  # (B, T)
        loss = reduce(per_token, batch, c)
        with torch.no_grad():
            shift = mu * (ratio - 1)  # (B, T) pi - mu
            weight = 1 - torch.sign(adv) * shift / c.delta  # (B, T) d l / d log pi = -A r w (Eq. 9)
        metrics = {
            "weight/mean": masked_mean(weight, mask),
            "weight/corrective_frac": masked_mean(weight < 0, mask),
            "penalty/mean": masked_mean(penalty, mask),
            "ratio/mean": masked_mean(ratio, mask),
        }
        return loss, metrics
