"""STAPO: silence spurious tokens and renormalise.

Paper: STAPO, arXiv 2602.15620. Thresholds from a third-party summary of the paper (Didi Tech / besthub.dev).

A tiny fraction (~0.01%) of tokens sit in correct responses yet have low probability and low entropy; they
inherit the full positive advantage, produce outsized gradients and drive late-stage collapse. STAPO masks
them and renormalises the loss over the remaining tokens. Objective (minimised), per token t of completion i:

    r       = pi_theta(y_t) / pi_old(y_t)
    tau_h   = the entropy_quantile (0.05) quantile of {H_t : mask_t = 1} over the batch (torch.quantile, linear)
    S_t     = 1[A_i > 0] 1[pi_theta(y_t) < tau_p] 1[H_t < tau_h]               (spurious token; detached)
    l_t     = max(-r A_i, -clip(r, 1 - clip_low, 1 + clip_high) A_i)           (GRPO clipped surrogate)
    loss    = sum_t mask_t (1 - S_t) l_t / sum_t mask_t (1 - S_t)

H_t is the entropy of pi_theta's next-token distribution (detached). Defaults: tau_p 0.01, entropy_quantile
0.05, clip 0.2 on both sides, group-normalised advantages. With no spurious token this is grpo with
token-mean aggregation. Relative to grpo: token-mean over the non-silenced tokens, and the silencing mask.
Confidence: SECONDARY (docs/methods.md, stapo): the abstract confirms the three criteria and the renormalisation;
the thresholds tau_p and tau_h are unverified against the paper.

Batch statistics and micro-batches. tau_h is a quantile of the tensor batch this loss is called with, so
micro-batches of one mini-batch would get different thresholds: the class sets `batch_statistics` and the
trainer passes each whole mini-batch in one call (thinkrl/learner/update.py); with several processes each holds
part of it, and the quantile and the silenced count span every part (TokenBatch.gather), so the update is the
one process's. The denominator is the global token count minus the silenced tokens, batch.num_tokens - sum(S):
over the whole mini-batch that is exactly sum mask (1 - S). If the batch is split without a gather, each part
still divides by (nearly) the global count, so the parts add up to the full loss up to the silenced tokens of
the other parts (about 1e-4 of the tokens), instead of being off by the number of parts as a per-call count
would be. No host-device sync: the count stays a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Clip, batch_quantile, clipped_loss, log_ratio, masked_mean, whole_batch


@dataclass
class Config(Clip):
    tau_p: float = 0.01
    """Probability threshold: a token with pi_theta(y_t) < tau_p (and the other two criteria) is silenced."""
    entropy_quantile: float = 0.05
    """tau_h = this quantile of the batch's token entropies; a token with entropy < tau_h counts as low-entropy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tau_p <= 1:
            raise ValueError(f"tau_p must be in (0, 1], got {self.tau_p}")
        if not 0 <= self.entropy_quantile <= 1:
            raise ValueError(f"entropy_quantile must be in [0, 1], got {self.entropy_quantile}")


@register("stapo")
class STAPO(Method[Config]):
    """GRPO clip, silencing positive-advantage tokens of low probability and low entropy, renormalised."""

    reinforce_on_policy = False  # silenced tokens drop out of the on-policy gradient
    batch_statistics = True  # the entropy quantile tau_h is over the whole batch the loss sees

    @property
    def requires(self) -> set[str]:
        return {"entropy"}

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask, adv = self.cfg, batch.mask, batch.advantages
        if batch.entropy is None:
            raise ValueError("stapo needs batch.entropy (listed in method.requires)")
        tau_h = batch_quantile(batch.entropy, batch, c.entropy_quantile)  # () over the mini-batch's valid tokens, on every rank
        prob = batch.logp.detach().exp()  # (B, T)
        spurious = mask & (adv > 0) & (prob < c.tau_p) & (batch.entropy < tau_h)  # (B, T)
        kept = mask & ~spurious  # (B, T)
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, c, trained=kept)  # (B, T)
        if batch.is_weights is not None:  # rollout correction, applied as in _common.reduce
            per_token = per_token * batch.is_weights
        per_token = torch.where(kept, per_token, 0.0)  # (B, T)
        silenced = whole_batch(spurious.sum().reshape(1), batch)[0].sum()  # () over every rank's part of the batch
        denom = ((batch.num_tokens or 0) - silenced).clamp(min=1)  # () global count less the silenced
        metrics["silenced/frac"] = masked_mean(spurious, mask)
        metrics["entropy/threshold"] = tau_h
        return per_token.sum() / denom, metrics
