"""GSPO: Group Sequence Policy Optimization (token form, GSPO-token).

Paper: "Group Sequence Policy Optimization", arXiv 2507.18071.
Exact-from-code reference: verl `compute_policy_loss_gspo`; TRL `importance_sampling_level="sequence"`.
Confidence: EXACT-CODE (methods.md 2.5).

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    log s_i  = (1 / |y_i|) sum_t log(pi_theta(y_t) / pi_old(y_t))      (geometric mean of the token ratios)
    log s_it = min(sg(log s_i) + log pi_theta(y_t) - sg(log pi_theta(y_t)), 10)
    l_t      = max(-s_it A_i, -clip(s_it, 1 - clip_low, 1 + clip_high) A_i)
    loss     = aggregate(l, seq-mean-token-mean)

s_it has the value s_i at every token of sequence i and the gradient of log pi_theta(y_t), so unclipped
the gradient of sequence i is -A_i s_i (1/|y_i|) sum_t grad log pi_theta(y_t); clipped, it is zero for the
whole sequence. sg is stop-gradient.

What it changes relative to grpo: one length-normalised sequence ratio replaces the per-token ratios, so
the trust region is enforced per sequence (a whole response is kept or dropped), and the clip range is
hundreds of times narrower (3e-4 vs 0.2) because log s_i averages |y_i| tokens. No dual clip, no KL.

Defaults: clip_low 3e-4, clip_high 4e-4 (GSPO v2, section 5.1), seq-mean-token-mean (verl forces it),
group-normalised advantages. The paper splits each rollout batch into 4 mini-batches (configs/gspo.yaml);
with a single on-policy update s_i = 1 and the clip never acts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, check_common, clipped_surrogate, log_ratio, masked_mean, reduce, with_norm_length

LOG_SEQ_RATIO_MAX = 10.0  # verl's cap on log s_it, so exp cannot overflow


@dataclass
class Config:
    clip_low: float = 3e-4
    """Lower clip: the sequence ratio is clipped at 1 - clip_low."""
    clip_high: float = 4e-4
    """Upper clip: the sequence ratio is clipped at 1 + clip_high."""
    aggregation: Aggregation = "seq-mean-token-mean"
    """How per-token losses become one scalar (methods.md 1.4); GSPO uses seq-mean-token-mean."""
    norm_length: int = 0
    """Constant L for seq-mean-token-sum-norm; 0 = rollout.max_new_tokens."""

    def __post_init__(self) -> None:
        check_common(self)


@register("gspo")
class GSPO(Method):
    """Clipped surrogate on the length-normalised sequence ratio (geometric mean of token ratios), clip 3e-4/4e-4."""

    Config = Config

    def loss(self, batch):
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        log_r = torch.where(mask, log_ratio(batch.logp, batch.old_logp), 0.0)  # (B, T)
        # mean over this row's own mask: micro-batches split rows, never positions, so s_i does not depend
        # on how the batch is cut
        log_s = log_r.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
        # value log s_i at every token, gradient that of log pi_theta(y_t)
        log_s_tok = (log_s.detach()[:, None] + batch.logp - batch.logp.detach()).clamp(max=LOG_SEQ_RATIO_MAX)  # (B, T)
        s = torch.exp(log_s_tok)  # (B, T)
        per_token, clipped = clipped_surrogate(s, adv, c.clip_low, c.clip_high)  # (B, T)
        metrics = {
            "clip/frac": masked_mean(clipped, mask),
            "clip/low_frac": masked_mean(clipped & (s < 1), mask),
            "clip/high_frac": masked_mean(clipped & (s > 1), mask),
            "ratio/mean": masked_mean(torch.exp(log_r), mask),  # token ratios r, for comparison with grpo
            "ratio/seq_mean": masked_mean(torch.exp(log_s), mask.any(-1)),  # s_i over the sequences with tokens
        }
        # with_norm_length: L = padded T for seq-mean-token-sum-norm when called outside the trainer
        return reduce(per_token, batch, with_norm_length(c, batch)), metrics
