"""Drawing one token per row from the processed next-token distribution, with its log-prob.

The processed distribution is softmax(logits / temperature) after top-k and top-p truncation (greedy: the
untempered softmax and its argmax); behav_logp is the log-prob of the drawn token under exactly that
distribution, which is what importance ratios against the sampler need. Every engine draws through here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.rollout.completions import Sampling


def processed_logp(logits: Tensor, s: Sampling) -> Tensor:
    """The log-distribution tokens are drawn from: log_softmax(logits / temperature) after top-k and top-p
    truncation (-inf outside the kept set); greedy (temperature 0): the untempered log_softmax.  (B, V) -> (B, V)"""
    logits = logits.float()  # (B, V)
    if s.temperature == 0:
        return torch.log_softmax(logits, -1)
    if s.temperature != 1.0:  # dividing by 1 changes no bit but costs a pass over (B, V)
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
    return torch.log_softmax(logits, -1)  # (B, V)


def draw(logits: Tensor, s: Sampling, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Draw one token per row with the uniforms u (B,) in [0, 1); return ids (B,), their log-probs (B,) and
    the whole log-distribution (B, V) they were drawn from (processed_logp)."""
    logp = processed_logp(logits, s)  # (B, V)
    if s.temperature == 0:
        ids = logp.argmax(-1)
        return ids, logp.gather(-1, ids[:, None]).squeeze(-1), logp
    # Inverse-CDF draw: one uniform per row. (torch.multinomial over a 49k vocabulary cost ~20 ms per call
    # on CPU, a third of a decode step.) right=True never lands on a zero-probability token.
    cdf = logp.exp().cumsum(-1)  # (B, V)
    target = u.to(cdf.dtype)[:, None] * cdf[:, -1:]  # (B, 1)
    ids = torch.searchsorted(cdf, target, right=True).clamp(max=logp.shape[-1] - 1).squeeze(-1)  # (B,)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1), logp


_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def draw_seeds(generator: torch.Generator | None, n: int, bound: int) -> list[int]:
    """n seeds in [0, bound) from the step's generator (or the global RNG). They are drawn on the generator's own
    device: the step's generator lives on the training device (setup.reseed), and a CUDA generator draws only
    CUDA tensors ("Expected a 'cpu' device type for generator" otherwise)."""
    device = generator.device if generator is not None else None
    return torch.randint(0, bound, (n,), generator=generator, device=device).tolist()


def request_seed(generator: torch.Generator | None) -> int:
    """One 62-bit seed per generate call, drawn from the step's generator (or the global RNG)."""
    return draw_seeds(generator, 1, 2**62)[0]


def uniforms(seed: int, request: Tensor, position: Tensor) -> Tensor:
    """The uniform in [0, 1) that draws token `position` of request `request` (both (B,) int64): a hash of
    (seed, request, position), splitmix64's finaliser. Each completion's draws depend on nothing else, so
    which slot a request decodes in, and which others share its batch, never changes what it samples:
    engines that schedule differently (lean with any number of slots, the reference loop) agree exactly."""
    x = (request * _signed(0x9E3779B97F4A7C15) + position * _signed(0xC2B2AE3D27D4EB4F) + _signed(seed & _MASK64)).long()
    x = (x ^ _shr(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _signed(0x94D049BB133111EB)
    x = x ^ _shr(x, 31)
    return _shr(x, 11).double() / float(1 << 53)  # (B,) the top 53 bits
