"""SAPO: Soft Adaptive Policy Optimization.

Paper: "Soft Adaptive Policy Optimization", arXiv 2511.20347 (Qwen). Exact-from-code reference: verl 0.9.1
`compute_policy_loss_sapo`; TRL loss_type `sapo`. Confidence: EXACT-CODE (docs/methods.md, sapo).

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    r      = pi_theta(y_t) / pi_old(y_t)                   (log r clamped to [-20, 20], as verl)
    tau    = tau_pos if A_i > 0 else tau_neg
    f(r)   = sigmoid(tau (r - 1)) * 4 / tau                (the soft gate; f(1) = 2 / tau, f'(1) = 1)
    l_t    = -f(r) A_i
    loss   = aggregate(l, seq-mean-token-mean)

d l_t / d log pi_theta = -4 s (1 - s) r A_i with s = sigmoid(tau (r - 1)): at r = 1 exactly REINFORCE's
-A_i, and the weight decays smoothly as r leaves 1 in either direction, instead of dropping to 0 at a hard
clip boundary. A larger tau narrows the gate; tau_neg > tau_pos damps negative-advantage tokens sooner, which
the paper argues keeps their many pushed-down logits from destabilising the vocabulary.

What it changes relative to grpo: no clip and no trust-region cliff; every token keeps a gradient whose size
falls off with its distance from r = 1. clip/frac counts nothing here; `gate/mean` (the mean of
4 s (1 - s), the token's gradient weight relative to REINFORCE) shows how far the soft gate acts.

Defaults: tau_pos 1.0, tau_neg 1.05 (the paper's and verl's), seq-mean-token-mean (verl forces it for SAPO;
here it is the default and may be changed). With one update per rollout r = 1 and SAPO trains like grpo, so
its recipe splits each rollout into 4 mini-batches, as the other ratio methods' do (a count chosen so the
method acts, not copied from the paper's runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Reduction, log_ratio, masked_mean, reduce


@dataclass
class Config(Reduction):
    tau_pos: float = 1.0
    """Gate temperature for tokens with a positive advantage (larger = a narrower gate around r = 1)."""
    tau_neg: float = 1.05
    """Gate temperature for tokens with advantage <= 0 (the paper sets it above tau_pos)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise ValueError(f"tau_pos and tau_neg must be > 0, got {self.tau_pos} and {self.tau_neg}")


@register("sapo")
class SAPO(Method[Config]):
    """A soft sigmoid gate on the ratio (temperatures 1.0 / 1.05) instead of the hard clip."""

    recipe = {"train.mini_batches": 4}  # several updates per rollout, so the gate acts (docs/methods.md, recipes)
    acts_off_policy = True

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, adv, mask = self.cfg, batch.advantages, batch.mask
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        tau = torch.where(adv > 0, c.tau_pos, c.tau_neg)  # (B, T)
        s = torch.sigmoid(tau * (ratio - 1.0))  # (B, T)
        per_token = -s * (4.0 / tau) * adv  # (B, T)
        weight = (4.0 * s * (1.0 - s)).detach()  # (B, T) d f / d r: the gradient's size relative to REINFORCE at r
        metrics = {"gate/mean": masked_mean(weight, mask), "ratio/mean": masked_mean(ratio, mask)}
        return reduce(per_token, batch, c), metrics
