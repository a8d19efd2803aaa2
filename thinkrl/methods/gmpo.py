"""GMPO: Geometric-Mean Policy Optimization.

Paper: "Geometric-Mean Policy Optimization", arXiv 2507.20673. Exact-from-code reference: verl 0.9.1
`compute_policy_loss_geo_mean` (policy_loss `geo_mean`); TRL has it only as an experimental trainer.
Confidence: EXACT-CODE (docs/methods.md, gmpo).

Objective (minimised), per completion i with advantage A_i (the mean of its tokens' advantages):

    d_t    = log pi_theta(y_t) - log pi_old(y_t)
    c_t    = sign(A_i) min(sign(A_i) d_t, sign(A_i) clip(d_t, -clip_low, clip_high))
                                               (each token clipped in log space, on the side its advantage pushes)
    s_i    = exp((1 / |y_i|) sum_t c_t)        (the geometric mean of the clipped token ratios)
    l_i    = -A_i s_i
    loss   = (1 / N) sum_i l_i                 (N sequences: seq-mean-token-mean of l_i at every token)

The gradient of sequence i is -A_i s_i (1 / |y_i|) sum_t [t unclipped] grad log pi_theta(y_t): each token
that stayed inside its side of the window contributes, scaled by the sequence's geometric-mean ratio. A
geometric mean moves far less than an arithmetic one when a single token's ratio is extreme, which is the
paper's case for it over GRPO's per-token ratios; the window (e^-0.4, e^0.4) is accordingly wider than
GRPO's 0.8 to 1.2.

What it changes relative to grpo: one ratio per sequence (like gspo), but built from tokens already clipped
one by one, so one sequence is never dropped whole; clip/frac counts clipped tokens.

Defaults: clip_low = clip_high = 0.4 in log space (the paper's range), seq-mean-token-mean. Rollout-
correction weights (correction.mode) multiply every token's copy of l_i, so a sequence takes the arithmetic
mean of its tokens' weights; verl takes their geometric mean. With one update per rollout d_t = 0, s_i = 1
and GMPO trains like grpo with seq-mean-token-mean, so its recipe splits each rollout into 4 mini-batches
(a count chosen so the clip acts, as for the other ratio methods).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Clip, Reduction, log_ratio, masked_mean, reduce


@dataclass
class Config(Clip, Reduction):
    clip_low: float = 0.4
    """Each token's log-ratio is clipped below at -clip_low (for A < 0: the ratio at e^-0.4)."""
    clip_high: float = 0.4
    """Each token's log-ratio is clipped above at clip_high (for A > 0: the ratio at e^0.4)."""


@register("gmpo")
class GMPO(Method[Config]):
    """One ratio per sequence: the geometric mean of its token ratios, each clipped in log space (e^+-0.4)."""

    recipe = {"train.mini_batches": 4}  # several updates per rollout, so the clip acts (docs/methods.md, recipes)
    acts_off_policy = True

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        d = log_ratio(batch.logp, batch.old_logp)  # (B, T)
        lengths = mask.sum(-1).clamp(min=1)  # (B,)
        adv = torch.where(mask, batch.advantages, 0.0).sum(-1) / lengths  # (B,) the sequence's advantage
        sign = torch.sign(adv)[:, None]  # (B, 1)
        clipped = d.clamp(-c.clip_low, c.clip_high)  # (B, T)
        kept = sign * torch.minimum(sign * d, sign * clipped)  # (B, T) a token past its side holds the bound
        log_s = torch.where(mask, kept, 0.0).sum(-1) / lengths  # (B,)
        per_seq = -adv * log_s.exp()  # (B,)
        per_token = per_seq[:, None].expand_as(d)  # (B, T) seq-mean-token-mean of this is the mean of per_seq
        hit = mask & (sign * d > sign * clipped)  # (B, T) clipped on the side its advantage pushes
        metrics = {
            "clip/frac": masked_mean(hit, mask),
            "clip/low_frac": masked_mean(hit & (d < 0), mask),
            "clip/high_frac": masked_mean(hit & (d > 0), mask),
            "ratio/mean": masked_mean(d.exp(), mask),
            "ratio/seq_mean": masked_mean(log_s.exp(), mask.any(-1)),
        }
        return reduce(per_token, batch, c), metrics
