"""Drawing one token per row from the processed next-token distribution, with its log-prob.

The processed distribution is softmax(logits / temperature) after top-k and top-p truncation (greedy: the
untempered softmax and its argmax); behav_logp is the log-prob of the drawn token under exactly that
distribution, which is what importance ratios against the sampler need. Every engine draws through here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.rollout.completions import Sampling


def draw(logits: Tensor, s: Sampling, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """Draw one token per row; return ids (B,), their log-probs (B,) and the whole log-distribution (B, V)
    they were drawn from (tempered and truncated; -inf outside the top-k / top-p set)."""
    logits = logits.float()  # (B, V)
    if s.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        ids = logp.argmax(-1)
        return ids, logp.gather(-1, ids[:, None]).squeeze(-1), logp
    logits = logits / s.temperature
    if s.top_k > 0:
        kth = torch.topk(logits, min(s.top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_logits, -1) >= s.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    logp = torch.log_softmax(logits, -1)  # (B, V)
    # Inverse-CDF draw: one uniform per row. (torch.multinomial over a 49k vocabulary cost ~20 ms per call
    # on CPU, a third of a decode step.) right=True never lands on a zero-probability token.
    cdf = logp.exp().cumsum(-1)  # (B, V)
    u = torch.rand((logits.shape[0], 1), generator=generator, device=logits.device) * cdf[:, -1:]  # (B, 1)
    ids = torch.searchsorted(cdf, u, right=True).clamp(max=logits.shape[-1] - 1).squeeze(-1)  # (B,)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1), logp
