"""Thinking Seeds: position-aware importance ratios for completions that start from a historical prefix.

Paper: "Thinking Seeds: Leveraging Historical Diversity for Position-Aware RL in LLMs" (v1: "SOUP: Token-level
Single-sample Mix-policy RL for LLMs"), arXiv 2601.21476. Only the abstract is public (docs/methods.md, thinking_seeds).

Some completions of each group begin with a prefix written by one of the model's own earlier checkpoints
pi_h (thinkrl/rollout/seeds.py, `seeds.enabled`); the current policy writes the rest. Each token is corrected against
the policy that actually wrote it. Objective (minimised), per valid token t of completion i with advantage
A_i, computed over the whole mixed group (seeded and unseeded completions share the baseline):

    r_t   = pi_theta(y_t) / pi_h(y_t)      on prefix tokens (prefix_mask = 1; pi_h's log-probs are behav_logp)
          = pi_theta(y_t) / pi_old(y_t)    on continuation tokens
    r_t   = min(r_t, prefix_cap)           on prefix tokens, when prefix_cap > 0 (pi_h is stale: r can be far from 1)
    l_t   = max(-r_t A_i, -clip(r_t, 1 - clip_low, 1 + clip_high) A_i)
    loss  = token-mean of w l       (w: the trainer's TIS/MIS weight, 1 on prefix tokens; see below)

A prefix token above the cap passes no gradient whatever the sign of A, so it counts in clip/frac (and
prefix/clip_frac) like a clipped token; prefix/cap_frac counts those alone. With A < 0 the clip window
never acts above 1, so the cap is then the only thing removing the gradient.

Rollout correction (`correction.mode` tis / mis, weight pi_old / mu): a continuation token was drawn by the
sampler mu and is ratioed against pi_old, so the weight bridges mu -> pi_old as for any method. A prefix token
is already ratioed against pi_h, the policy that wrote it (its behav_logp): pi_old / pi_h on top would
correct it twice (pi_theta pi_old / pi_h^2), and MIS would drop most stale prefixes. So the trainer leaves
the weight of prefix tokens at 1 and a sequence-level weight takes the product over continuation tokens
only (`mismatch_corrected` = "prefix", thinkrl/learner/correction.py).

Defaults: host dapo (clip 0.2 / 0.28) or grpo (0.2 / 0.2); prefix_cap 2; token-mean; GRPO advantages. With no
prefix (L = 0 everywhere) it is exactly the host loss with token-mean; with pi_h = pi_old it is on-policy.
Relative to grpo: the ratio of prefix tokens is taken against the historical policy, optionally capped,
and the loss is token-mean.

Confidence (docs/methods.md, thinking_seeds): INTERPRETATION throughout except that prefixes come from the model's own
historical checkpoints, continuations are on-policy, and ratios are token-level (EXACT-PAPER, abstract).
The cap and the host settings are this project's choices, as are the rollout defaults in thinkrl/rollout/seeds.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, HostedConfig, clip_metrics, clipped_loss, log_ratio, masked_mean, reduce


@dataclass
class Config(HostedConfig):
    host: Literal["grpo", "dapo"] = "dapo"
    """Clip settings to start from: grpo (0.2 / 0.2) or dapo (0.2 / 0.28)."""
    prefix_cap: float = 2.0
    """Cap on prefix-token ratios pi_theta / pi_h (0 = no cap)."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prefix_cap < 0 or 0 < self.prefix_cap <= 1:
            raise ValueError(f"prefix_cap must be > 1 (or 0 = off), got {self.prefix_cap}")


@register("thinking_seeds")
class ThinkingSeeds(Method[Config]):
    """Prefix tokens from a historical checkpoint ratioed against it, continuation tokens against pi_old (clip)."""

    recipe = {
        "seeds.every": 10,
        "seeds.pool_size": 4,
        "seeds.keep_initial": True,
        "seeds.per_group": 2,
    }  # a pool that fills within a 40-step demo run

    @property
    def mismatch_corrected(self) -> str:
        return "prefix"  # prefix tokens are ratioed against pi_h, the policy that wrote them

    @property
    def requires(self) -> set[str]:
        # prefix_mask: seeds.enabled defaults to on for this method. entropy: for the prefix / continuation
        # metrics (the training forward computes it anyway)
        return {"prefix_mask", "entropy"}

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        prefix = batch.prefix_mask if batch.prefix_mask is not None else torch.zeros_like(mask)  # (B, T) bool
        prefix = prefix & mask
        cont = mask & ~prefix
        anchor = torch.where(prefix, batch.behav_logp, batch.old_logp)  # (B, T) pi_h on the prefix, pi_old after
        log_r = log_ratio(batch.logp, anchor)  # (B, T)
        ratio = torch.exp(log_r)  # (B, T)
        capped = torch.zeros_like(mask)  # (B, T) prefix tokens whose gradient the cap removed
        if c.prefix_cap > 0:
            capped = prefix & (ratio.detach() > c.prefix_cap) & (batch.advantages != 0)
            ratio = torch.where(prefix, ratio.clamp(max=c.prefix_cap), ratio)  # a capped token passes no gradient
        per_token, clipped, metrics = clipped_loss(ratio, batch, c)  # (B, T)
        # the cap removes gradient the clip may not (A < 0 never clips above 1): count both as "lost to clipping"
        clipped = clipped | capped
        metrics.update(clip_metrics(clipped, ratio, mask))
        metrics["prefix/cap_frac"] = masked_mean(capped, prefix)
        for name, part in (("prefix", prefix), ("cont", cont)):
            metrics[f"{name}/token_frac"] = masked_mean(part, mask)
            metrics[f"{name}/clip_frac"] = masked_mean(clipped, part)
            metrics[f"{name}/abs_log_ratio"] = masked_mean(log_r.abs(), part)
            if batch.entropy is not None:
                metrics[f"{name}/entropy"] = masked_mean(batch.entropy, part)
        return reduce(per_token, batch, c), metrics
