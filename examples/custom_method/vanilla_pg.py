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

from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Reduction, reduce
from thinkrl.ops import masked_mean


@dataclass
class Config(Reduction):
    """Only the shared reduction fields (aggregation, norm_length); a method adds its own here."""


@register("vanilla_pg")
class VanillaPG(Method[Config]):
    """REINFORCE with a group-mean baseline: -A log pi, no ratio, no clip (plugin example)."""

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        per_token = -batch.advantages * batch.logp  # (B, T)
        metrics = {"logp/mean": masked_mean(batch.logp, batch.mask)}
        return reduce(per_token, batch, self.cfg), metrics
