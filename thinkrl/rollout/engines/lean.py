"""The lean engine: continuous batching over the lean decoder's slots (lean_decoder.py).

Requests are the step's P x G completions (or eval's problems x n). `slots` of them decode together; when
some finish, their slots are refilled from the queue of pending requests, so slots stay full until the
queue runs dry: with reasoning-length spreads (hundreds to tens of thousands of tokens) a batch no longer
runs at the pace of its longest row with most slots empty. Refills wait until a sixteenth of the slots is
free (or nothing else is live), so one prefill pass serves several requests; the completions of one prompt
that start together share that pass, and it also gives each request its first token (no decode step spent
on the prompt's last token). Once the queue is dry and at most half the active slots are live, the
live rows move down into the lowest slots (copying only their own keys and values, into storage for them
alone) and later steps run over those slots alone.

Each step draws one token per live row through thinkrl/rollout/sampling.py, so behav_logp is the log-prob
under the tempered and truncated distribution, as with every engine; a request's random draws depend only
on (the call's seed, request, position), so the number of slots and the refill order change nothing. A
model the lean decoder does not cover is decoded by the reference loop (reference.py) in batches of `slots`
rows. Memory: the storage holds the active slots x the longest live row (see slot_storage.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import torch
from torch import Tensor

from thinkrl import accel
from thinkrl.rollout.completions import Completions, Request
from thinkrl.rollout.engines.lean_decoder import LeanDecoder
from thinkrl.rollout.engines.recorder import Recorder
from thinkrl.rollout.engines.reference import reference_generate
from thinkrl.rollout.sampling import draw, request_seed, uniforms


@torch.no_grad()
def lean_generate(model, req: Request, slots: int = 0) -> tuple[Completions, dict[str, float]]:
    """req's completions, decoded `slots` at a time (0 = all at once), and the call's statistics:
    generate/slot_utilisation, the mean share of slots live on steps taken while requests were still waiting
    (1.0 when they never had to wait), generate/decode_steps, and the peak key/value storage:
    generate/kv_capacity (positions per slot) and generate/kv_mb."""
    R, G = req.rows, req.group_size
    S = min(slots or R, R)
    if not LeanDecoder.supports(model):
        parts, per = [], max(1, S // G)  # whole groups per batch
        for i in range(0, len(req.prompts), per):
            own = req.budgets[i * G : (i + per) * G] if req.budgets is not None else None
            parts.append(reference_generate(model, replace(req, prompts=req.prompts[i : i + per], budgets=own)))
        return Completions.cat(parts, req.pad_id), {}
    dec = LeanDecoder.for_model(model)
    device = dec.kv.lengths.device if dec.kv.lengths.numel() else next(model.parameters()).device
    dec.reset(S, max(map(len, req.prompts), default=0) + max(req.limits(), default=0))  # no row runs past these
    rec = Recorder(R, req.pad_id, device, req.record_topk, req.record_entropy)
    try:
        return _run(dec, req, rec)
    finally:
        dec.release()  # the storage is freed before the caller's next phase
        accel.phase_end()  # and what the CPU block cache kept of this one


# over 60 lines: advance and fill are closures over the slots' state (seven tensors and the queue), which
# split into functions of their own would pass all of it back and forth
def _run(dec: LeanDecoder, req: Request, rec: Recorder):
    device, S = rec.device, len(dec.kv.lengths)
    prompts, G, sampling = req.prompts, req.group_size, req.sampling
    limit = torch.tensor(req.limits(), device=device)  # (R,)
    queue = deque(range(req.rows))  # request r answers prompt r // G
    slot_req = torch.full((S,), -1, dtype=torch.long, device=device)  # the request each slot decodes
    tokens = torch.full((S,), req.pad_id, dtype=torch.long, device=device)  # each slot's next input token
    live = torch.zeros(S, dtype=torch.bool, device=device)
    made = torch.zeros(S, dtype=torch.long, device=device)  # tokens each slot's request has generated
    eos = torch.tensor(req.eos_ids, dtype=torch.long, device=device)
    refill_at = max(1, S // 16)
    seed = request_seed(req.generator)
    active = S  # steps run over slots [0, active)
    busy_share, busy_steps, steps = 0.0, 0, 0

    def advance(idx: Tensor, logits: Tensor) -> None:
        """Slots idx (b,) draw their next token from logits (b, V); finished slots are freed."""
        if sampling.min_new_tokens:  # no end of sequence before min_new_tokens
            early = made[idx] < sampling.min_new_tokens  # (b,)
            logits[:, eos] = logits[:, eos].masked_fill(early[:, None], float("-inf"))
        req = slot_req[idx]
        tok, lp, dist = draw(logits, sampling, uniforms(seed, req, made[idx]))  # (b,), (b,), (b, V)
        rec.add(req, tok, lp, dist)
        made[idx] += 1
        ended = torch.isin(tok, eos)  # (b,)
        rec.finish(req[ended])
        tokens[idx] = tok
        gone = idx[ended | (made[idx] >= limit[req])]
        live[gone] = False
        dec.kv.free(gone)

    def fill(free: list[int]) -> None:
        """Start the next requests in these free slots: prefill each distinct prompt once, for every slot
        that starts it, and draw each request's first token from the prefill's logits (a request that ends
        there frees its slot for the next one at once)."""
        while free and queue:
            take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            where = torch.tensor(free[: len(take)], device=device)
            distinct = list(dict.fromkeys(r // G for r in take))
            which = torch.tensor([distinct.index(r // G) for r in take], device=device)
            logits = dec.prefill(where, [prompts[p] for p in distinct], which)  # (k, V)
            slot_req[where] = torch.tensor(take, device=device)
            live[where], made[where] = True, 0
            advance(where, logits)
            free = free[len(take) :] + where[~live[where]].tolist()

    fill(list(range(S)))
    while True:
        idx = live[:active].nonzero().squeeze(-1)  # (b,) live slots
        if idx.numel() == 0:
            break
        if queue:
            busy_share, busy_steps = busy_share + idx.numel() / S, busy_steps + 1
        logits = dec.step(tokens[:active], live[:active])  # (active, V)
        steps += 1
        advance(idx, logits if idx.numel() == active else logits[idx])  # (b, V)
        if idx.numel() > int(live[:active].sum()):  # some rows finished
            free = (~live).nonzero().squeeze(-1).tolist()
            if queue and (len(free) >= refill_at or not bool(live.any())):
                fill(free)
            elif not queue:
                active = _compact(dec, live, active, slot_req, tokens, made)
    share = busy_share / busy_steps if busy_steps else 1.0
    stats = {"generate/slot_utilisation": share, "generate/decode_steps": float(steps), "generate/kv_capacity": float(dec.kv.peak)}
    return rec.completions(), {**stats, "generate/kv_mb": dec.kv.peak_bytes / 2**20}


def _compact(dec: LeanDecoder, live: Tensor, active: int, *per_slot: Tensor) -> int:
    """With the queue dry and at most half of [0, active) live, pack the live rows into the lowest slots (their
    keys, values and per-slot state; the decoder's storage shrinks to them) and return the new active count."""
    n = int(live[:active].sum())
    if n == 0 or n > active // 2:
        return active
    src = live[:active].nonzero().squeeze(-1)  # (n,)
    dst = torch.arange(n, device=src.device)
    dec.kv.compact(src)
    for t in per_slot:
        t[dst] = t[src]
    live[:active] = False
    live[dst] = True
    return n
