"""Dr.GRPO: GRPO done right.

Paper: "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783.
Exact-from-code reference: TRL loss_type `dr_grpo`; verl `loss_agg_mode=seq-mean-token-sum-norm` with
`norm_adv_by_std_in_grpo=False`. Confidence: EXACT-CODE (docs/methods.md, dr_grpo).

Objective (minimised), per token t of completion i, over the N completions of the update batch:

    A_i   = R_i - mean(R over the group)                                (no division by the group std)
    r     = pi_theta(y_t) / pi_old(y_t)
    l_t   = max(-r A_i, -clip(r, 1 - clip_low, 1 + clip_high) A_i)      (grpo's clipped surrogate)
    loss  = sum_i sum_t l_t / (N * L)                                   (seq-mean-token-sum-norm, L constant)

What it changes relative to grpo: it removes two biases and nothing else. Dividing by the group std
up-weights prompts that are almost always or almost never solved (difficulty bias); dividing each sequence
by its own length gives long wrong answers a smaller per-token penalty (length bias). Here the advantage
estimator is `no_std` (used when advantage.estimator is auto) and every token sum is divided by one
constant L. grpo's dual_clip and beta remain available and are off, as in the paper.

Defaults: clip 0.2 both sides, beta 0, no dual clip, aggregation seq-mean-token-sum-norm, norm_length 0,
which the trainer replaces by rollout.max_new_tokens (TRL divides by max_completion_length). Called
directly on a TokenBatch with norm_length 0, L is the batch's padded length T (verl's default
loss_scale_factor); set norm_length when micro-batches may be padded to different lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.methods import grpo, register
from thinkrl.methods._common import Aggregation


@dataclass
class Config(grpo.Config):
    aggregation: Aggregation = "seq-mean-token-sum-norm"


@register("dr_grpo")
class DrGRPO(grpo.GRPO):
    """GRPO without its length and difficulty biases: no-std advantages, token sums over a constant length."""

    Config = Config
    cfg: Config
    advantage = "no_std"
