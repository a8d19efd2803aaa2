"""GSPO: Group Sequence Policy Optimization (token form, GSPO-token).

Paper: "Group Sequence Policy Optimization", arXiv 2507.18071.
Exact-from-code reference: verl `compute_policy_loss_gspo`; TRL `importance_sampling_level="sequence"`.
Confidence: EXACT-CODE (docs/methods.md, gspo).

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
group-normalised advantages. The paper splits each rollout batch into 4 mini-batches (its recipe);
with a single on-policy update s_i = 1 and the clip never acts.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import ClipConfig, clipped_loss, log_ratio, masked_mean, reduce, sequence_ratio


@dataclass
class Config(ClipConfig):
    clip_low: float = 3e-4
    clip_high: float = 4e-4


@register("gspo")
class GSPO(Method[Config]):
    """Clipped surrogate on the length-normalised sequence ratio (geometric mean of token ratios), clip 3e-4/4e-4."""

    recipe = {"train.mini_batches": 4}  # GSPO v2, section 5.1: each rollout split into 4 mini-batches
    acts_off_policy = True

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        mask = batch.mask
        log_r = log_ratio(batch.logp, batch.old_logp)  # (B, T)
        s, log_s = sequence_ratio(log_r, batch.logp, mask)  # (B, T) value s_i, gradient of log pi_theta(y_t)
        per_token, _, metrics = clipped_loss(s, batch, self.cfg, ratio_key=None)  # (B, T)
        metrics["ratio/mean"] = masked_mean(log_r.exp(), mask)  # token ratios r, for comparison with grpo
        metrics["ratio/seq_mean"] = masked_mean(log_s.exp(), mask.any(-1))  # s_i over the sequences with tokens
        return reduce(per_token, batch, self.cfg), metrics
