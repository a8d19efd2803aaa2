"""ICT: Independent Combinatorial Tokens, the GRPO surrogate on the tokens with the most distinctive distributions.

Paper: "Beyond Entropy: Learning from Token-Level Distributional Deviations for LLM Reasoning" (X. Feng et al.),
arXiv 2606.19771. Only the abstract could be read; everything below is this project's reading of it (docs/methods.md, ict).

Instead of ranking tokens by one number of their next-token distribution (entropy, as the 80/20 rule does),
ICT compares whole distributions: the Jensen-Shannon divergence of each position's distribution to a reference
finds the "critical branching points", and only the top 10% of unique tokens are updated. The paper reports
lower Shannon entropy with the second-order Renyi entropy kept under control. Objective (minimised):

    p_t     = softmax(z_t / temperature) of pi_old, detached           (the trainer computes token_js)
    pbar    = mean of p_t over the valid positions of the rollout batch  (reference=batch)
              or of the same response                                   (reference=response)
    JS_t    = 1/2 KL(p_t || m_t) + 1/2 KL(pbar || m_t),  m_t = (p_t + pbar) / 2     (natural log, in [0, ln 2])
    unit=token_id:  score(v) = mean of JS_t over the valid positions with y_t = v;
                    keep the ceil(frac * #distinct ids) best ids; sel_t = 1[y_t is kept]
    unit=position:  keep the ceil(frac * #valid positions) positions with the largest JS_t
    r       = pi_theta(y_t) / pi_old(y_t)
    l_t     = sel_t max(-r A, -clip(r, 1 - clip_low, 1 + clip_high) A)
    loss    = sum_t l_t / (number of valid tokens)    (token-mean as in 80/20: unselected tokens stay in the count)

Ties: every unit whose score equals the k-th best is kept too, so the selection can exceed ceil(frac * n) but
never depends on the order of rows or positions (the 80/20 rule's `>=` convention). ceil is taken after
rounding frac * n to 9 decimals (0.1 x 30 is 3, not 4), and at least one unit is kept when there is any.

Defaults: frac 0.1, unit token_id, reference batch, GRPO clip 0.2/0.2, token-mean. frac = 1 is exactly grpo
with token-mean aggregation. The selection is a statistic of the batch the loss is called with, so the class
sets `batch_statistics` and the trainer passes a whole mini-batch in one call.

Relative to grpo: token-mean aggregation, and the policy gradient only on the selected tokens; needs token_js
and the sampled ids (`requires`).

Confidence (docs/methods.md, ict): INTERPRETATION throughout (abstract only): the batch-mean reference (the
per-response mean and the reference model's distribution are alternatives; the first is `reference`), the
de-duplication of "unique tokens" by id with a mean score (unit=position is the other reading), pi_old as
the distribution (the current policy, detached, is the other reading; pi_old is its value before the first update),
token-mean, the tie rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, ClipConfig, clipped_loss, log_ratio, masked_mean, reduce


def _top_units(scores: Tensor, frac: float) -> Tensor:
    """Which of n scores are kept: those >= the k-th largest, k = ceil(frac n) (ties all kept).  (n,) -> (n,)"""
    if scores.numel() == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    k = min(scores.numel(), max(1, math.ceil(round(frac * scores.numel(), 9))))
    return scores >= scores.topk(k).values[-1]


@torch.no_grad()
def select_tokens(
    token_js: Tensor, mask: Tensor, frac: float, unit: str, token_ids: Tensor | None = None, gather=None
) -> tuple[Tensor, int, int]:
    """ICT's selection: the (B, T) positions trained on, the number of units and how many were kept. The units
    are ranked over the whole batch: `gather` (TokenBatch.gather) pools the valid positions of every process."""
    pool = gather or (lambda x: (x, 0))
    n = int(mask.sum())
    if unit == "position":
        scores, start = pool(token_js[mask])  # (N,)
        keep_all = _top_units(scores, frac)  # (N,)
        units, kept = scores.numel(), int(keep_all.sum())
    elif unit == "token_id":
        if token_ids is None:
            raise ValueError("ict with unit=token_id needs batch.token_ids (listed in method.requires)")
        (ids, start), (js, _) = pool(token_ids[mask]), pool(token_js[mask])  # (N,), (N,)
        # on the CPU in float64: a few thousand numbers, and CPU index_add_ sums in index order, so the scores
        # (and the tie rule) are bitwise reproducible; CUDA's index_add_ accumulates with atomics
        uniq, inv, counts = torch.unique(ids.cpu(), return_inverse=True, return_counts=True)  # (U,), (N,), (U,)
        score = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, js.cpu().double()) / counts  # (U,) mean JS per id
        kept_ids = _top_units(score, frac)  # (U,)
        keep_all = kept_ids[inv].to(mask.device)  # (N,) every occurrence of a kept id
        units, kept = len(uniq), int(kept_ids.sum())
    else:
        raise ValueError(f"unit must be token_id or position, got {unit!r}")
    keep_valid = keep_all[start : start + n]  # (n,) this call's positions
    return torch.zeros_like(mask).masked_scatter(mask, keep_valid), units, kept


@dataclass
class Config(ClipConfig):
    frac: float = 0.1
    """Fraction of units (distinct token ids, or valid positions) trained on: those with the largest JS."""
    unit: Literal["token_id", "position"] = "token_id"
    """token_id = rank the distinct sampled ids by mean JS over their occurrences; position = rank positions."""
    reference: Literal["batch", "response"] = "batch"
    """Reference distribution of the JS: the mean over the rollout batch's valid positions, or over the same response."""
    aggregation: Aggregation = "token-mean"
    """How per-token losses become one scalar; unselected tokens count as zeros."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.frac <= 1:
            raise ValueError(f"frac must be in (0, 1] (1 = every token, i.e. grpo with token-mean), got {self.frac}")
        if self.unit not in ("token_id", "position"):
            raise ValueError(f"unit must be token_id or position, got {self.unit!r}")
        if self.reference not in ("batch", "response"):
            raise ValueError(f"reference must be batch or response, got {self.reference!r}")


@register("ict")
class ICT(Method[Config]):
    """GRPO surrogate on the top 10% unique tokens ranked by JS divergence of their distribution to the batch mean."""

    reinforce_on_policy = False  # on-policy the gradient is REINFORCE on the JS-selected tokens only
    batch_statistics = True  # the JS ranking is over the whole batch the loss sees

    @property
    def requires(self) -> set[str]:
        return {"token_js", "token_ids"} if self.cfg.unit == "token_id" else {"token_js"}

    @property
    def js_reference(self) -> str:
        """Which mean distribution the trainer's token_js compares each position with: batch or response."""
        return self.cfg.reference

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        if batch.token_js is None:
            raise ValueError("ict needs batch.token_js (listed in method.requires)")
        keep, units, kept = select_tokens(batch.token_js, mask, c.frac, c.unit, batch.token_ids, batch.gather)  # (B, T)
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, c, trained=keep)  # (B, T)
        per_token = torch.where(keep, per_token, 0.0)  # (B, T) where, not *: no gradient reaches unselected tokens
        metrics["select/frac"] = masked_mean(keep, mask)
        metrics["ict/units"] = torch.tensor(float(units), device=mask.device)
        metrics["ict/units_kept"] = torch.tensor(float(kept), device=mask.device)
        metrics["ict/js_mean"] = masked_mean(batch.token_js, mask)
        metrics["ict/js_selected_mean"] = masked_mean(batch.token_js, keep)
        return reduce(per_token, batch, c), metrics
