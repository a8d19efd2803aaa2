"""The reference decode loop: the model's own transformers forward with its KV cache, one batch at a time.

Every prompt is prefilled once (left-padded) and its cache repeated for the G completions; finished rows
leave the batch; nothing refills their place. It runs any causal LM, so it is what the other engines are
tested against and what `lean` falls back to for architectures its decoder does not cover.
"""

from __future__ import annotations

import torch

from thinkrl.models import cache_kwarg, left_pad
from thinkrl.rollout.completions import Completions, Request
from thinkrl.rollout.engines.recorder import Recorder
from thinkrl.rollout.sampling import draw, request_seed, uniforms


@torch.no_grad()
def reference_generate(model, req: Request) -> Completions:
    """req.group_size consecutive completions per prompt (rows p*G .. p*G+G-1 answer prompts[p])."""
    from transformers import DynamicCache

    prompts, group_size, sampling = req.prompts, req.group_size, req.sampling
    device = next(model.parameters()).device
    ids, attn, pos = left_pad(prompts, req.pad_id, device)  # (P, L): every row's next position is at the end
    # prompts of one length need no mask: then the forward builds no 4-D mask per decode step
    padded = not bool(attn.all())
    cache = DynamicCache()  # filled in place by every forward below
    kv = {cache_kwarg(model): cache, "use_cache": True}
    out = model(input_ids=ids, attention_mask=attn if padded else None, position_ids=pos, logits_to_keep=1, **kv)
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    logits = out.logits[:, -1].repeat_interleave(group_size, 0)  # (B, V)
    attn = attn.repeat_interleave(group_size, 0)  # (B, L)
    next_pos = pos[:, -1].repeat_interleave(group_size, 0) + 1  # (B,)
    B = len(prompts) * group_size
    rec = Recorder(B, req.pad_id, device, req.record_topk, req.record_entropy)
    seed = request_seed(req.generator)
    eos = torch.tensor(req.eos_ids, dtype=torch.long, device=device)
    limit = torch.tensor(req.limits(), device=device)  # (B,)
    rows = torch.arange(B, device=device)  # which requests are still in the decode batch
    for t in range(int(limit.max())):
        if t < sampling.min_new_tokens:  # fixed-length benchmarks: no end before min_new_tokens
            logits = logits.index_fill(-1, eos, float("-inf"))
        tok, lp, dist = draw(logits, sampling, uniforms(seed, rows, torch.full_like(rows, t)))  # (b,), (b,), (b, V)
        rec.add(rows, tok, lp, dist)
        ended = torch.isin(tok, eos)
        rec.finish(rows[ended])
        done = ended | (limit[rows] <= t + 1)
        if bool(done.all()):
            break
        if bool(done.any()):  # finished rows leave the batch
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, tok, attn, next_pos = rows[keep], tok[keep], attn[keep], next_pos[keep]
        if padded:
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=-1)
        mask = attn if padded else None
        logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], **kv).logits[:, -1]
        next_pos = next_pos + 1
    return rec.completions()
