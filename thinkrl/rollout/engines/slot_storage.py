"""Key/value storage of the lean decoder's slots (lean_decoder.py).

S slots, each holding one sequence from position 0 to lengths[s], in one (S, Hk, C, D) tensor per layer and
per key/value. The capacity C grows in chunks as the longest live sequence grows (never the whole budget up
front), so memory follows the longest live row, not the budget; growth stops at the longest prompt plus the
largest budget, which no row can pass (a geometric step would otherwise overshoot it by up to half). A freed
slot is refilled in place by the decoder's prefill: nothing is copied when rows finish. Once nothing waits to
be refilled, `compact` packs the live rows into storage for them alone, so the last long rows of a batch do
not grow storage for every slot.

Storage is only ever remade at other sizes, so every replaced tensor goes back to the system at once
(accel.phase_end) instead of into the CPU block cache, where no later request would fit it and it would
stay resident to the end of the generation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from thinkrl import accel

CHUNK = 64  # smallest capacity step, in positions; growth is geometric above it (amortised O(1) per token)


class SlotStorage:
    """Keys and values of `layers` layers with Hk key heads of width D, for the slots set by `reset`."""

    def __init__(self, layers: int, Hk: int, D: int) -> None:
        self.n_layers, self.Hk, self.D = layers, Hk, D
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.peak = 0  # the largest capacity this generation reached, in positions
        self.peak_bytes = 0  # and the largest storage, in bytes
        self.ceiling: int | None = None  # no sequence is ever longer: capacity never grows past it

    def reset(self, slots: int, like: Tensor, ceiling: int | None = None) -> None:
        """Empty storage for `slots` sequences in like's dtype and device (capacity grows on demand, up to
        `ceiling` positions when given)."""
        self.ceiling = ceiling
        shape = (slots, self.Hk, 0, self.D)
        self.keys = [like.new_empty(shape) for _ in range(self.n_layers)]
        self.values = [like.new_empty(shape) for _ in range(self.n_layers)]
        self.lengths = torch.zeros(slots, dtype=torch.long, device=like.device)
        self.peak, self.peak_bytes = 0, 0

    def release(self) -> None:
        self.keys, self.values = [], []

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, positions: int) -> None:
        """Room for `positions` positions in every slot: grow by at least half the capacity (and CHUNK), to no
        more than the ceiling."""
        if positions <= self.capacity:
            return
        new = max(positions, self.capacity + max(CHUNK, self.capacity // 2))
        new = -(-new // CHUNK) * CHUNK
        if self.ceiling is not None:
            new = max(positions, min(new, self.ceiling))

        def grown(kv: Tensor) -> Tensor:
            # zeros, not empty: masked positions still enter attention as 0 x value, and 0 x NaN is NaN
            out = kv.new_zeros((kv.shape[0], self.Hk, new, self.D))
            out[:, :, : kv.shape[2]] = kv
            return out

        self._remake(grown)
        self.peak = new
        held = sum(kv.numel() * kv.element_size() for store in (self.keys, self.values) for kv in store)
        self.peak_bytes = max(self.peak_bytes, held)

    @torch.no_grad()
    def compact(self, src: Tensor) -> None:
        """Keep only the sequences of slots src, packed into the first len(src) slots of storage sized for them
        alone: once few rows are live, later steps and later growth cost what those rows need."""
        n, end = len(src), int(self.lengths[src].max()) if len(src) else 0

        def packed(kv: Tensor) -> Tensor:
            out = kv.new_zeros((n, self.Hk, kv.shape[2], self.D))
            out[:, :, :end] = kv[src, :, :end]
            return out

        self._remake(packed)
        self.lengths = self.lengths[src].clone()

    def free(self, slots: Tensor) -> None:
        """These slots hold nothing any more (their storage is reused by the next prefill)."""
        self.lengths[slots] = 0

    def _remake(self, make: Callable[[Tensor], Tensor]) -> None:
        """Replace every key and value tensor kv by make(kv), each old block handed back as soon as it is replaced."""
        for store in (self.keys, self.values):
            for i in range(len(store)):
                store[i] = make(store[i])
                accel.phase_end()
