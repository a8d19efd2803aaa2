"""The rollout batch the update phase works on, and how it is cut into passes that fit in memory.

Within a mini-batch, sequences are sorted by length and cut into micro-batches of train.micro_batch_size rows
and at most train.micro_batch_tokens padded completion tokens; losses use the mini-batch's global token and
sequence counts, so the cut never changes the update (only its memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl import distributed
from thinkrl.rollout.completions import Completions


@dataclass
class RolloutBatch:
    prompt_ids: list[list[int]]  # B prompts (each repeated G times)
    comp: Completions  # (B, T) tokens, behav_logp, mask
    advantages: Tensor  # (B,)
    group_size: int  # rows g*G .. g*G+G-1 answer prompt g


def micro_batches(rows: Tensor, lengths: Tensor, size: int, group_size: int, max_tokens: int = 0) -> list[Tensor]:
    """Rows ordered by prompt group, longest completion first within a group, cut into micro-batches of at
    most `size` rows and, with max_tokens, at most that many padded completion tokens (rows x longest):
    a group's completions share one prompt forward, similar lengths pad less, and long completions get
    fewer rows per pass, so activation memory stays bounded as completions grow."""
    key = (rows // group_size) * (lengths.max() + 1) - lengths[rows]
    order = rows[torch.argsort(key, stable=True)].tolist()
    out, current, longest = [], [], 0
    for r in order:
        L = int(lengths[r])
        if current and (len(current) == size or (max_tokens and (len(current) + 1) * max(longest, L) > max_tokens)):
            out.append(torch.tensor(current))
            current, longest = [], 0
        current.append(r)
        longest = max(longest, L)
    if current:
        out.append(torch.tensor(current))
    return out


def mini_batch_rows(rows: int, pieces: int, epoch: int) -> list[Tensor]:
    """This process's rows (local indices) of each of the epoch's `pieces` mini-batches.

    The shuffle is one permutation of the global batch, drawn from a generator seeded by torch.initial_seed()
    (the step's seed, the same on every rank: train.seed_step) and the epoch, cut into `pieces`; each rank keeps
    its own rows of every piece (ranks hold consecutive blocks of the global batch). Mini-batch k therefore
    holds the same completions whatever the process count, so a torchrun run takes the single-process updates.
    A rank may hold no row of a piece: update_passes gives it a zero-weight pass."""
    if pieces == 1:
        return [torch.arange(rows)]
    sizes = distributed.all_gather(rows)  # dynamic sampling may leave ranks with different counts
    start = sum(sizes[: distributed.world()[0]])
    g = torch.Generator().manual_seed((torch.initial_seed() * 1_000_003 + epoch) % 2**63)
    order = torch.randperm(sum(sizes), generator=g)
    return [piece[(piece >= start) & (piece < start + rows)] - start for piece in order.tensor_split(pieces)]


def update_passes(
    mini: Tensor, order: Tensor, lengths: Tensor, mask: Tensor, size: int, group: int, max_tokens: int, num_tokens: int, world: int
) -> list[Tensor]:
    """The micro-batches to run for one mini-batch (mask on the CPU). One process: those with a token to
    train on. Several: all of them, or one zero-weight row when this rank's share is empty, so that every
    rank runs at least one (gradient-synchronising) backward whenever the global mini-batch has tokens."""
    if num_tokens == 0:
        return []  # nothing anywhere: every rank skips this update
    micros = micro_batches(mini, lengths, size, group, max_tokens)
    if world == 1:
        return [rows for rows in micros if int(mask[rows].sum())]
    return micros or [order[:1]]
