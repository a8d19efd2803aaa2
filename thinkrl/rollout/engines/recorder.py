"""Turning a decode loop's steps into `Completions`, the same way for every engine.

A loop reports each step's sampled tokens as (request, token, log-prob, distribution) for the rows that drew
one; `Recorder` writes them, with what the step asked for (top-K, entropy of the distribution the token was
drawn from), into (R, capacity) buffers and returns right-padded (R, T) tensors at the end. The capacity grows
geometrically with the longest completion, so memory follows the generated tokens; writing in place, rather
than keeping a few small tensors per step, keeps small long-lived allocations from fragmenting the CPU heap
between a step's large temporaries (docs/benchmarks.md has the measurement).
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.rollout.completions import Completions


class Recorder:
    def __init__(self, requests: int, pad_id: int, device, record_topk: int = 0, record_entropy: bool = False) -> None:
        self.R, self.pad, self.device = requests, pad_id, device
        self.topk, self.entropy = record_topk, record_entropy
        self.lengths = torch.zeros(requests, dtype=torch.long, device=device)
        self.finished = torch.zeros(requests, dtype=torch.bool, device=device)
        self.buffers: dict[str, Tensor] = {}
        self.width = record_topk  # top-K columns: min(K, vocabulary size) once a step has been recorded
        self._grow(0)

    def _grow(self, capacity: int) -> None:
        """Buffers with room for `capacity` tokens per request, keeping what is written."""
        R, dev, K = self.R, self.device, self.topk
        fresh = {
            "tokens": torch.full((R, capacity), self.pad, dtype=torch.long, device=dev),
            "behav": torch.zeros((R, capacity), dtype=torch.float32, device=dev),
        }
        if K:
            fresh["topk_ids"] = torch.zeros((R, capacity, K), dtype=torch.long, device=dev)
            fresh["topk_logp"] = torch.zeros((R, capacity, K), device=dev)
        if self.entropy:
            fresh["entropy"] = torch.zeros((R, capacity), device=dev)
        for name, old in self.buffers.items():
            fresh[name][:, : old.shape[1]] = old
        self.buffers, self.capacity = fresh, capacity

    def add(self, req: Tensor, tok: Tensor, logp: Tensor, dist: Tensor | None) -> None:
        """One step: requests req (b,) drew tokens tok (b,) with log-probs logp (b,) from dist (b, V), the
        processed log-distribution (needed only when top-K or entropy is recorded)."""
        pos = self.lengths[req]  # (b,)
        need = int(pos.max()) + 1 if len(pos) else 0
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity, 64))
        buf = self.buffers
        buf["tokens"][req, pos], buf["behav"][req, pos] = tok, logp.float()
        if self.topk:
            assert dist is not None
            self.width = min(self.topk, dist.shape[-1])
            top = dist.topk(self.width, dim=-1)  # (b, K)
            buf["topk_ids"][req, pos, : self.width] = top.indices
            buf["topk_logp"][req, pos, : self.width] = top.values.clamp(min=-1e4)  # -inf (truncated) -> finite
        if self.entropy:
            assert dist is not None
            buf["entropy"][req, pos] = -torch.where(dist > -torch.inf, dist.exp() * dist, 0.0).sum(-1)  # (b,)
        self.lengths[req] += 1

    def finish(self, req: Tensor) -> None:
        """These requests ended with an end-of-sequence token (the others are truncated)."""
        self.finished[req] = True

    def completions(self) -> Completions:
        T = int(self.lengths.max()) if self.R else 0
        out = {name: buf[:, :T].clone() for name, buf in self.buffers.items()}  # (R, T[, K]): the capacity let go
        self.buffers = {}
        for name in ("topk_ids", "topk_logp"):  # a vocabulary smaller than K gives fewer columns
            if name in out:
                out[name] = out[name][..., : self.width]
        mask = torch.arange(T, device=self.device)[None] < self.lengths[:, None]  # (R, T)
        return Completions(
            out["tokens"], out["behav"], mask, self.lengths.clone(), ~self.finished,
            out.get("topk_ids"), out.get("topk_logp"), out.get("entropy"),
        )  # fmt: skip
