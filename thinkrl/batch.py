"""TokenBatch: the one typed input of every policy loss.

Shape letters used across thinkrl: B = sequences (prompts x G), G = group size, T = completion length
(prompt excluded), V = vocabulary, K = top-K width. Every per-token field is (B, T).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# entropy is not here: a method with Method.entropy_grad gets it with its gradient (thinkrl/learner/update.py)
_NO_GRAD = ("old_logp", "behav_logp", "advantages", "old_entropy", "ref_logp", "token_js", "topk_old_logp", "is_weights", "uniform")
_PER_TOKEN = (
    "logp",
    "old_logp",
    "behav_logp",
    "advantages",
    "prefix_mask",
    "entropy",
    "old_entropy",
    "ref_logp",
    "token_js",
    "is_weights",
    "token_ids",
    "uniform",
)
_TOPK = ("topk_ids", "topk_old_logp", "topk_logp")


@dataclass
class TokenBatch:
    logp: Tensor  # (B, T) log pi_theta(y_t), carries grad
    old_logp: Tensor  # (B, T) log pi_old(y_t): policy at the start of this update phase
    behav_logp: Tensor  # (B, T) log mu(y_t): whoever sampled the token
    advantages: Tensor  # (B, T) per-sequence advantage broadcast over tokens; (B,) is broadcast for you
    mask: Tensor  # (B, T) 1 = generated token that is trained on, 0 = padding
    token_ids: Tensor | None = None  # (B, T) long, the sampled ids y_t (methods that look tokens up by id)
    prefix_mask: Tensor | None = None  # (B, T) 1 = token from a historical-checkpoint prefix
    entropy: Tensor | None = None  # (B, T) entropy of pi_theta's next-token distribution (grad iff Method.entropy_grad)
    old_entropy: Tensor | None = None  # (B, T) entropy of pi_old
    ref_logp: Tensor | None = None  # (B, T) reference model log-prob (KL)
    topk_ids: Tensor | None = None  # (B, T, K) top-K ids of the proposal distribution
    topk_old_logp: Tensor | None = None  # (B, T, K) proposal log-probs there
    topk_logp: Tensor | None = None  # (B, T, K) pi_theta log-probs there (carries grad)
    token_js: Tensor | None = None  # (B, T) JS divergence of each position to the batch mean
    is_weights: Tensor | None = None  # (B, T) rollout-correction weights (TIS/MIS), multiply the per-token loss
    num_tokens: int | None = None  # global count of mask == 1 tokens in the whole update batch
    num_seqs: int | None = None  # global count of sequences in the update batch
    generator: torch.Generator | None = None  # for methods that draw random numbers
    uniform: Tensor | None = None  # (B, T) one U(0, 1) draw per token, the same whatever the batching (requires "uniform")
    # gather(x (n,)) -> (every process's x in rank order (N,), where this one's starts): set by the trainer for a
    # method with batch_statistics when several processes hold parts of one mini-batch; a collective, so every
    # process calls it the same number of times. None: this call holds the whole batch.
    gather: Callable[[Tensor], tuple[Tensor, int]] | None = None

    def __post_init__(self) -> None:
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be (B, T), got shape {tuple(self.logp.shape)}")
        shape = self.logp.shape
        if self.advantages.dim() == 1:
            self.advantages = self.advantages[:, None].expand(shape)
        self.mask = self.mask.bool()
        if self.mask.shape != shape:
            raise ValueError(f"mask has shape {tuple(self.mask.shape)}, expected {tuple(shape)}")
        for name in _PER_TOKEN + _TOPK:
            value = getattr(self, name)
            if value is None:
                continue
            want = shape if name in _PER_TOKEN else None
            if want is not None and value.shape != want:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(want)}")
            if name in _TOPK and value.shape[:2] != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected ({shape[0]}, {shape[1]}, K)")
            if name in _NO_GRAD and value.requires_grad:
                raise ValueError(f"{name} must not carry grad (detach it)")
            # Zero-fill padding once, here, so no method can let junk at mask == 0 reach the loss or the
            # gradient (torch.where passes no gradient to the unselected branch).
            m = self.mask if value.dim() == 2 else self.mask[..., None]
            setattr(self, name, torch.where(m, value, torch.zeros((), dtype=value.dtype)))
        if self.num_tokens is None:
            self.num_tokens = int(self.mask.sum())
        if self.num_seqs is None:
            self.num_seqs = shape[0]

    def split(self, sizes: list[int]) -> list[TokenBatch]:
        """Micro-batches along B that keep the global num_tokens / num_seqs (for tests and the trainer)."""
        out, start = [], 0
        for n in sizes:
            fields = {}
            for f in dataclasses.fields(self):
                v = getattr(self, f.name)
                fields[f.name] = v[start : start + n] if isinstance(v, Tensor) else v
            out.append(TokenBatch(**fields))
            start += n
        return out
