"""Turning a decode loop's steps into `Completions`, the same way for every engine.

A loop reports each step's sampled tokens as (request, position, token, log-prob, distribution) for the rows
that drew one; `Recorder` keeps what the step asked for (top-K, entropy of the distribution the token was
drawn from) and assembles right-padded (R, T) tensors at the end. Memory follows the generated tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.rollout.completions import Completions


class Recorder:
    def __init__(self, requests: int, pad_id: int, device, record_topk: int = 0, record_entropy: bool = False) -> None:
        self.R, self.pad, self.device = requests, pad_id, device
        self.topk, self.entropy = record_topk, record_entropy
        self.parts: list[tuple[Tensor, ...]] = []
        self.lengths = torch.zeros(requests, dtype=torch.long, device=device)
        self.finished = torch.zeros(requests, dtype=torch.bool, device=device)

    def add(self, req: Tensor, tok: Tensor, logp: Tensor, dist: Tensor | None) -> None:
        """One step: requests req (b,) drew tokens tok (b,) with log-probs logp (b,) from dist (b, V), the
        processed log-distribution (needed only when top-K or entropy is recorded)."""
        pos = self.lengths[req]  # (b,)
        extra: tuple[Tensor, ...] = ()
        if self.topk:
            assert dist is not None
            top = dist.topk(min(self.topk, dist.shape[-1]), dim=-1)  # (b, K)
            extra += (top.indices, top.values.clamp(min=-1e4))  # -inf (truncated) -> finite
        if self.entropy:
            assert dist is not None
            extra += (-torch.where(dist > -torch.inf, dist.exp() * dist, 0.0).sum(-1),)  # (b,)
        self.parts.append((req, pos, tok, logp.float(), *extra))
        self.lengths[req] += 1

    def finish(self, req: Tensor) -> None:
        """These requests ended with an end-of-sequence token (the others are truncated)."""
        self.finished[req] = True

    def completions(self) -> Completions:
        R, dev = self.R, self.device
        T = int(self.lengths.max()) if R else 0
        cols = [torch.cat(c) for c in zip(*self.parts)] if self.parts else []
        tokens = torch.full((R, T), self.pad, dtype=torch.long, device=dev)
        behav = torch.zeros((R, T), dtype=torch.float32, device=dev)
        topk_ids = topk_logp = entropy = None
        if cols:
            req, pos = cols[0], cols[1]
            tokens[req, pos], behav[req, pos] = cols[2], cols[3]
            if self.topk:
                topk_ids = torch.zeros((R, T, cols[4].shape[-1]), dtype=torch.long, device=dev)
                topk_logp = torch.zeros((R, T, cols[4].shape[-1]), device=dev)
                topk_ids[req, pos], topk_logp[req, pos] = cols[4], cols[5]
            if self.entropy:
                entropy = torch.zeros((R, T), device=dev)
                entropy[req, pos] = cols[-1]
        elif self.topk:
            topk_ids = torch.zeros((R, T, self.topk), dtype=torch.long, device=dev)
            topk_logp = torch.zeros((R, T, self.topk), device=dev)
        if self.entropy and entropy is None:
            entropy = torch.zeros((R, T), device=dev)
        mask = torch.arange(T, device=dev)[None] < self.lengths[:, None]  # (R, T)
        return Completions(tokens, behav, mask, self.lengths.clone(), ~self.finished, topk_ids, topk_logp, entropy)
