"""SIS: Selective Importance Sampling, a plug-in for the ratio of GRPO, DAPO or GSPO.

Paper: "Turning Off-Policy Tokens On-Policy: A Plug-in Approach for Improving LLM Alignment" (Yu Li et al.),
arXiv 2607.04728. No official code was found; this follows Algorithm 1 as read in docs/methods.md, sis.

The policy that produced the rollout (pi_old) is a proposal and the current policy pi_theta the target. A
per-token rejection test with a top-K envelope decides which tokens are already distributed as pi_theta; those
are trained as on-policy tokens (weight 1, no clip), the others keep their ordinary importance ratio.
Objective (minimised), per valid token t of completion i with advantage A_i:

    w_t   = pi_theta(y_t) / pi_old(y_t)                         (detached for the test)
    V_K   = the K most likely ids of pi_old(. | s_t)             (topk_ids, from the trainer)
    M_t   = max over v in V_K of pi_theta(v) / pi_old(v)         (the top-K envelope, detached)
    z_t   = 1[y_t in V_K] 1[u_t < w_t / M_t],   u_t ~ U(0, 1)    (y_t outside V_K is always rejected)
    w~_t  = exp(log pi_theta(y_t) - sg(log pi_theta(y_t)))  if z_t = 1    (value 1, gradient of log pi_theta)
          = w_t (differentiable)                           if z_t = 0
    host grpo, dapo:  l_t = max(-w~_t A_i, -clip(w~_t, 1 - clip_low, 1 + clip_high) A_i)
    host gspo:        log s_i = mean_t sg(log w~_t)     (accepted tokens add 0)
                      s_it = exp(min(sg(log s_i) + log pi_theta(y_t) - sg(log pi_theta(y_t)), 10))
                      l_t = max(-s_it A_i, -clip(s_it, 1 - clip_low, 1 + clip_high) A_i)
    loss  = aggregate(l, the host's aggregation)

An accepted token is distributed as pi_theta renormalised on V_K (Proposition 1 with a top-K envelope; the
error is the mass pi_theta puts outside V_K), so its weight is 1 and the clip never touches it (1 lies inside
every clip range). The token-vs-sequence surrogate gap of Theorem 1 depends on D = sum_t |log w_t|, which SIS
lowers to D_SIS = sum_t (1 - z_t) |log w_t| <= D. With pi_theta == pi_old every id of V_K has ratio 1, every
token in V_K is accepted and every other has w = 1, so SIS is exactly the on-policy host loss.

Defaults: K = 10 (the paper's sweep over 10/50/100 moves accuracy by about a point); host grpo with its clip
0.2/0.2 and seq-mean-token-mean; dapo is 0.2/0.28 token-mean; gspo is 3e-4/4e-4 seq-mean-token-mean.
clip_low, clip_high and aggregation left at None take the host's values. Reported acceptance: 0.80-0.95.

Relative to grpo: the ratio of tokens that pass the rejection test is replaced by a gradient-carrying 1, so
they are never clipped; needs the proposal's top-K ids and log-probs and pi_theta's log-probs at those ids
(`requires`), the sampled ids, and random numbers (batch.generator, else the global torch RNG).

Confidence (docs/methods.md, sis): SECONDARY, close to the paper, for Algorithm 1 (top-K envelope, Bernoulli(w/M),
accept -> 1, reject -> w). INTERPRETATION: the gradient-carrying 1 (a constant 1 would kill the accepted
tokens' gradient); a fresh u at every loss call (pi_theta changes between mini-batch updates); M_t is taken
as max(M_t, w_t) so that w/M <= 1 even when logp and topk_logp come from different passes; top-K entries
with zero proposal probability (truncated by top-k/top-p sampling) are not part of V_K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, HostedConfig, clipped_loss, log_ratio, masked_mean, reduce, sequence_ratio


@dataclass
class Config(HostedConfig):
    host: Literal["grpo", "dapo", "gspo"] = "grpo"
    """Loss SIS plugs into: grpo (clip 0.2/0.2), dapo (0.2/0.28, token-mean) or gspo (sequence ratio, 3e-4/4e-4)."""
    k: int = 10
    """K of the top-K envelope: the proposal's K most likely ids at each position."""
    accept: Literal["test", "all"] = "test"
    """test = the paper's rejection test; all = every token accepted (a control, not SIS: the update then
    differs from this SIS only by its test, each token trained at weight 1 on the gradient of log pi)."""
    aggregation: Aggregation | None = None  # type: ignore[assignment]
    """How per-token losses become one scalar; None = the host's (token-mean for dapo)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")


class RejectionTest(NamedTuple):
    """Outcome of the per-token test, all detached (B, T)."""

    log_w: Tensor  # log pi_theta(y_t) / pi_old(y_t), clamped to [-20, 20]
    prob: Tensor  # acceptance probability w / M in [0, 1]; 0 outside V_K
    in_topk: Tensor  # y_t in V_K (and a valid token)
    accepted: Tensor  # z_t


@torch.no_grad()
def rejection_test(batch: TokenBatch) -> RejectionTest:
    """Draw the SIS rejection test z_t for every token of `batch` (docs/methods.md, sis)."""
    ids, topk_ids, topk_old, topk_new = batch.token_ids, batch.topk_ids, batch.topk_old_logp, batch.topk_logp
    if ids is None or topk_ids is None or topk_old is None or topk_new is None:
        missing = [n for n in ("token_ids", "topk_ids", "topk_old_logp", "topk_logp") if getattr(batch, n) is None]
        raise ValueError(f"sis needs batch.{', batch.'.join(missing)} (listed in method.requires)")
    mask = batch.mask
    log_w = log_ratio(batch.logp.detach(), batch.old_logp)  # (B, T)
    # a zero-probability proposal entry (-inf, or the sampler's finite stand-in for a truncated id) can never
    # have been drawn: it is outside the proposal's support, and its ratio would blow the envelope up
    support = topk_old.exp() > 0  # (B, T, K)
    log_ratio_k = torch.where(support, log_ratio(topk_new.detach(), topk_old), -torch.inf)  # (B, T, K)
    in_topk = mask & ((topk_ids == ids[..., None]) & support).any(-1)  # (B, T)
    # max with log w: the same number in exact arithmetic when y_t is in V_K; guards against two passes
    # disagreeing in the last bits, so that w / M never exceeds 1
    log_m = torch.maximum(log_ratio_k.max(-1).values, log_w)  # (B, T)
    prob = torch.where(in_topk, torch.exp(log_w - log_m), 0.0)  # (B, T)
    # the trainer's per-token draws (batch.uniform: one per token, whatever the micro-batch cut or the process
    # count); a direct call draws one u per position of the padded (B, T) grid from batch.generator
    u = batch.uniform if batch.uniform is not None else torch.rand(mask.shape, generator=batch.generator, device=mask.device)  # (B, T)
    return RejectionTest(log_w, prob, in_topk, in_topk & (u < prob))


@register("sis")
class SIS(Method[Config]):
    """Selective importance sampling: tokens passing a top-K rejection test train on-policy (weight 1, unclipped)."""

    # off-policy updates, where accepted tokens can differ from ratio-clipped ones; the proposal is the policy
    # that sampled (the paper's off-policy model), so pi_old and its top-K are the sampler's own, however stale
    recipe = {
        "rollout.group_size": 16,
        "train.mini_batches": 4,
        "train.old_policy": "sampler",
    }
    acts_off_policy = True

    reinforce_on_policy = True  # on-policy every token in V_K is accepted (w~ = 1, gradient of log pi), the rest have r = 1

    @property
    def requires(self) -> set[str]:
        return {"topk_ids", "topk_old_logp", "topk_logp", "token_ids", "uniform"}

    @property
    def topk_width(self) -> int:
        return self.cfg.k

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        test = rejection_test(batch)
        if c.accept == "all":  # the control: the test's outcome replaced by acceptance of every valid token
            test = test._replace(accepted=mask.bool())
        log_r = log_ratio(batch.logp, batch.old_logp)  # (B, T) differentiable
        on_policy = batch.logp - batch.logp.detach()  # (B, T) value 0, gradient of log pi_theta
        log_wt = torch.where(test.accepted, on_policy, log_r)  # (B, T) log w~
        if c.host == "gspo":  # accepted tokens add 0 to log s_i
            weight, _ = sequence_ratio(log_wt, batch.logp, mask)  # (B, T) s_it
        else:
            weight = torch.exp(log_wt)  # (B, T) w~
        per_token, _, metrics = clipped_loss(weight, batch, c, ratio_key="ratio/sis_mean")  # (B, T)
        abs_log_w = torch.where(mask, test.log_w.abs(), 0.0)  # (B, T)
        has_tokens = mask.any(-1)  # (B,)
        metrics["sis/accept_frac"] = masked_mean(test.accepted, mask)
        metrics["sis/accept_prob"] = masked_mean(test.prob, mask)  # expected acceptance, without the draw noise
        metrics["sis/outside_topk_frac"] = masked_mean(~test.in_topk, mask)
        # Theorem 1's per-sequence divergences, averaged over the sequences with tokens
        metrics["sis/D"] = masked_mean(abs_log_w.sum(-1), has_tokens)
        metrics["sis/D_sis"] = masked_mean(torch.where(test.accepted, 0.0, abs_log_w).sum(-1), has_tokens)
        metrics["ratio/mean"] = masked_mean(torch.exp(test.log_w), mask)  # raw token ratios, comparable with grpo
        return reduce(per_token, batch, c), metrics
