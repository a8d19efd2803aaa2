"""What every engine returns: sampled completions with the behaviour log-probs of their tokens.

`Sampling` is the distribution tokens are drawn from (temperature, top-p, top-k, budget); `Request` is one
engine call (prompts, G, sampling, end ids, what to record), the one argument every engine takes; `Completions`
holds the sampled rows with everything the trainer needs of the sampler: behav_logp = log mu(y_t) under
that distribution (tempered and truncated), and, when a method asks, the sampler's top-K and entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0  # EOS is suppressed before this many tokens (fixed-length benchmarks)


@dataclass
class Request:
    """One generate call: `group_size` consecutive completions per prompt (rows p*G .. p*G+G-1 answer prompts[p])."""

    prompts: list[list[int]]
    group_size: int
    sampling: Sampling
    eos_ids: list[int]
    pad_id: int
    generator: torch.Generator | None = None  # the call's randomness; None = torch's default generator
    record_topk: int = 0  # record the sampling distribution's top-K per token (when the sampler stands in for pi_old)
    record_entropy: bool = False  # and its entropy
    budgets: list[int] | None = None  # one per completion (each at most sampling.max_new_tokens); None = all the same
    step: int | None = None  # a training rollout: its step (0-based, = updates so far); the server engine versions by it

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.group_size

    def limits(self) -> list[int]:
        """Each completion's token budget."""
        top = self.sampling.max_new_tokens
        return [min(b, top) for b in self.budgets] if self.budgets is not None else [top] * self.rows

    def each_completion(self) -> list[list[int]]:
        """The prompt of every completion, in row order."""
        return [p for p in self.prompts for _ in range(self.group_size)]


@dataclass
class Completions:
    tokens: Tensor  # (B, T) completion ids, right-padded with pad_id
    behav_logp: Tensor  # (B, T) log mu of each sampled token, 0 at padding
    mask: Tensor  # (B, T) bool, 1 = generated token (EOS included)
    lengths: Tensor  # (B,) generated tokens per row
    truncated: Tensor  # (B,) bool, hit max_new_tokens without EOS
    topk_ids: Tensor | None = None  # (B, T, K) top-K ids of the sampling distribution (when recorded)
    topk_logp: Tensor | None = None  # (B, T, K) its log-probs there
    entropy: Tensor | None = None  # (B, T) entropy of the sampling distribution (when recorded)
    prefix_len: Tensor | None = None  # (B,) Thinking Seeds: leading tokens written by a historical checkpoint
    seed_step: Tensor | None = None  # (B,) the step of that checkpoint, -1 for unseeded rows

    def select(self, rows: Tensor) -> Completions:
        """These rows only, trimmed to their longest completion."""
        T = int(self.lengths[rows].max()) if len(rows) else 0
        cut = lambda x: x[rows, :T] if x is not None else None  # noqa: E731
        pick = lambda x: x[rows] if x is not None else None  # noqa: E731
        return Completions(
            cut(self.tokens),
            cut(self.behav_logp),
            cut(self.mask),
            self.lengths[rows],
            self.truncated[rows],
            cut(self.topk_ids),
            cut(self.topk_logp),
            cut(self.entropy),
            pick(self.prefix_len),
            pick(self.seed_step),
        )

    @property
    def prefix_mask(self) -> Tensor | None:
        """(B, T) 1 = a token of a historical-checkpoint prefix."""
        if self.prefix_len is None:
            return None
        return torch.arange(self.tokens.shape[1], device=self.tokens.device)[None] < self.prefix_len[:, None]

    @staticmethod
    def cat(parts: list[Completions], pad_id: int) -> Completions:
        """Rows of several generation rounds in one batch (right-padded to the longest)."""
        T = max(p.tokens.shape[1] for p in parts)

        def join(name: str, value):
            if getattr(parts[0], name) is None:
                return None
            padded = []
            for p in parts:
                x = getattr(p, name)
                widths = (0, 0) * (x.dim() - 2) + (0, T - x.shape[1])  # pad dim 1 only
                padded.append(torch.nn.functional.pad(x, widths, value=value))
            return torch.cat(padded)

        return Completions(
            join("tokens", pad_id),
            join("behav_logp", 0.0),
            join("mask", False),
            torch.cat([p.lengths for p in parts]),
            torch.cat([p.truncated for p in parts]),
            join("topk_ids", 0),
            join("topk_logp", 0.0),
            join("entropy", 0.0),
            *(
                torch.cat([getattr(p, name) for p in parts]) if getattr(parts[0], name) is not None else None
                for name in ("prefix_len", "seed_step")
            ),
        )
