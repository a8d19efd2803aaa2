"""KL-Cov: a KL penalty on the few tokens whose log-prob and advantage covary most.

Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617.
Exact-from-code reference: verl 0.9.1 `compute_policy_loss_kl_cov` (adapted there from the paper's code).
Confidence: EXACT-CODE for the loss; the defaults are verl's (docs/methods.md, kl_cov).

The sibling of Clip-Cov (clip_cov.py, which explains the covariance): instead of detaching high-covariance
tokens, it keeps their gradient and pulls them back towards pi_old. Objective (minimised), per token t:

    d_t    = log pi_theta(y_t) - log pi_old(y_t),   r_t = exp(d_t)
    cov_t  = (A_t - mean A)(log pi_theta(y_t) - mean log pi_theta)            (means over the batch's tokens)
    K      = the max(1, floor(kl_ratio N)) tokens with the largest cov_t      (N valid tokens)
    l_t    = -r_t A_t + kl_coef |d_t| [t in K]
    loss   = aggregate(l, token-mean)

No clip: the surrogate is the plain ratio-weighted one, and the penalty is the only trust region, on K alone.
At r = 1 exactly the penalty's gradient is 0 (torch's |x| has gradient 0 at 0), so with one update per
rollout (pi_old is the training forward itself) the gradient is REINFORCE's; once pi_theta moves, each token
of K is pulled back with force kl_coef. The kink has a cost, as in verl: where pi_old comes from a separate
forward (several mini-batches), the first update's d_t is float noise of either sign, and each token of K gets
a gradient of +-kl_coef from it; runs that differ only in that noise (another process count) then differ.

Batch statistics: the means, N and the top-k span the whole mini-batch (every process's part), so
`batch_statistics` is set and the trainer passes each mini-batch in one call; verl computes them per micro-batch
and per data-parallel rank, which equals this with one micro-batch on one process. d_t is clamped to
[-20, 20] before exp (thinkrl's log_ratio; verl does not clamp here), which only matters past e^20.

Defaults: kl_ratio 2e-4 (verl's) and kl_coef 1.0 (verl's loss falls back to 1 when the coefficient is unset;
its config class writes 0.1), token-mean. The paper's values per model size were not checked here. Recipe: 4
mini-batches per rollout, as clip_cov's, so the penalty pulls once pi_theta has moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, Reduction, batch_covariance, local_tokens, log_ratio, masked_mean, reduce


@dataclass
class Config(Reduction):
    kl_ratio: float = 2e-4
    """Share of the batch's valid tokens, those of largest covariance, that carry the penalty (at least one)."""
    kl_coef: float = 1.0
    """Coefficient of |log pi_theta - log pi_old| on those tokens."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.kl_ratio <= 1:
            raise ValueError(f"kl_ratio must be in (0, 1], got {self.kl_ratio}")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")


@register("kl_cov")
class KLCov(Method[Config]):
    """Unclipped ratio surrogate with a |log ratio| penalty on the top 2e-4 of tokens by covariance."""

    recipe = {"train.mini_batches": 4}  # several updates per rollout, so the penalty pulls (as clip_cov's)
    batch_statistics = True  # covariance means, token count and the top-k span the whole mini-batch

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        d = log_ratio(batch.logp, batch.old_logp)  # (B, T)
        ratio = d.exp()  # (B, T)
        cov, offset, _ = batch_covariance(batch)  # (N,)
        k = min(max(1, int(cov.numel() * c.kl_ratio)), cov.numel())  # at least one token, where there is one
        top = torch.topk(cov, k).indices  # (k,) positions in the whole batch
        penalised = local_tokens(top, offset, mask)  # (B, T)
        per_token = -ratio * batch.advantages + torch.where(penalised, c.kl_coef * d.abs(), 0.0)  # (B, T)
        metrics = {
            "cov/frac": masked_mean(penalised, mask),
            "kl/abs_log_ratio": masked_mean(d.abs(), mask),
            "ratio/mean": masked_mean(ratio, mask),
        }
        return reduce(per_token, batch, c), metrics
