"""20-Entropy (the 80/20 rule): train only on high-entropy "forking" tokens.

Paper: "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM
Reasoning", arXiv 2506.01939. Exact-from-code reference: TRL `get_high_entropy_mask` (`top_entropy_quantile`).

Only about 20% of the tokens of a chain of thought are high-entropy forks where the model chooses a path;
restricting the DAPO policy gradient to them matches or beats training on every token. Objective (minimised):

    r       = pi_theta(y_t) / pi_old(y_t)
    tau     = the (1 - rho) quantile of {H_t : mask_t = 1} over the batch (torch.quantile, linear interpolation)
    l_t     = 1[H_t >= tau] max(-r A, -clip(r, 1 - clip_low, 1 + clip_high) A)
    loss    = sum_t l_t / (number of valid tokens)        (token-mean: unselected tokens stay in the denominator)

H_t is the entropy of pi_theta's next-token distribution from the current forward pass, detached (TRL).
Defaults: rho 0.2; DAPO's clip 0.2 / 0.28; token-mean; group-normalised advantages. rho = 1 is exactly DAPO.

Relative to grpo: clip-higher (0.28), token-mean, and the entropy mask. Confidence: EXACT-CODE (docs/methods.md, entropy_fork).

The quantile is a statistic of the batch: it is taken over the tensor batch this loss is called with. Were a
mini-batch split into micro-batches, each would get its own threshold and the micro-batch losses would not
add up to the full-batch loss (the contract's micro-batch check fails on its test batch), so the class sets
`batch_statistics` and the trainer passes each whole mini-batch in one call (thinkrl/learner/update.py); with
several processes the quantile pools every rank's part of it (TokenBatch.gather), as TRL gathers across ranks.
TRL takes it over every valid token of the step; here it is per mini-batch (train.mini_batches > 1 gives one
threshold per mini-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, ClipConfig, batch_quantile, clipped_loss, log_ratio, masked_mean, reduce


@dataclass
class Config(ClipConfig):
    rho: float = 0.2
    """Fraction of valid tokens trained on: those with entropy >= the (1 - rho) quantile of the batch."""
    clip_high: float = 0.28
    aggregation: Aggregation = "token-mean"
    """How per-token losses become one scalar; unselected tokens count as zeros."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.rho <= 1:
            raise ValueError(f"rho must be in (0, 1] (1 = every token, i.e. DAPO), got {self.rho}")


@register("entropy_fork")
class EntropyFork(Method[Config]):
    """DAPO surrogate on the top-rho (20%) highest-entropy tokens of the batch only (the 80/20 rule)."""

    recipe = {
        "rollout.dynamic_sampling": True,
        "reward.overlong_buffer": 0.2,
    }  # built on DAPO's loop: dynamic sampling and the soft overlong punishment

    reinforce_on_policy = False  # on-policy the gradient is REINFORCE on the high-entropy tokens only
    batch_statistics = True  # the entropy quantile is over the whole batch the loss sees

    @property
    def requires(self) -> set[str]:
        return {"entropy"}

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        if batch.entropy is None:
            raise ValueError("entropy_fork needs batch.entropy (listed in method.requires)")
        tau = batch_quantile(batch.entropy, batch, 1.0 - c.rho)  # () over the mini-batch's valid tokens, on every rank
        keep = mask & (batch.entropy >= tau)  # (B, T) ties at tau are kept, as in TRL
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, c, trained=keep)  # (B, T)
        metrics["entropy/threshold"] = tau
        metrics["select/frac"] = masked_mean(keep, mask)
        return reduce(per_token * keep, batch, c), metrics
