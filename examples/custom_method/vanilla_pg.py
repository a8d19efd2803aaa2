"""vanilla_pg: REINFORCE with the group-mean baseline, no ratio and no clipping (a thinkrl plugin example).

Objective (minimised), per generated token t of completion i with advantage A_i:

    l_t  = -A_i * log pi_theta(y_t)
    loss = aggregate(l, mode=aggregation)

This is the on-policy policy gradient that every clipped method reduces to when pi_theta == pi_old. It is
only correct with one update per rollout (train.mini_batches = train.epochs = 1), since it ignores
old_logp. Defaults: seq-mean-token-mean aggregation, group-normalised advantages.

Use it without touching thinkrl:   thinkrl train --plugins examples/custom_method --method vanilla_pg
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, reduce
from thinkrl.ops import masked_mean


@dataclass
class Config:
    aggregation: Aggregation = "seq-mean-token-mean"
    """How per-token losses become one scalar."""
    norm_length: int = 0
    """Constant L for seq-mean-token-sum-norm; 0 = rollout.max_new_tokens."""


@register("vanilla_pg")
class VanillaPG(Method):
    """REINFORCE with a group-mean baseline: -A log pi, no ratio, no clip (plugin example)."""

    Config = Config

    def loss(self, batch):
        per_token = -batch.advantages * batch.logp  # (B, T)
        metrics = {"logp/mean": masked_mean(batch.logp, batch.mask)}
        return reduce(per_token, batch, self.cfg), metrics
