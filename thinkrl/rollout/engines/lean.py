"""Sample G completions per prompt with the KV cache, recording each token's behaviour log-prob.

behav_logp is log mu(y_t) under the distribution the token was actually drawn from: softmax(logits / T)
after top-k / top-p truncation (greedy: the untempered softmax). Each prompt is prefilled once and its cache
repeated G times; rows that have emitted EOS leave the decode batch, so a batch costs what its longest
completion costs only for the rows still running.
"""

from __future__ import annotations

import torch

from thinkrl.models import cache_kwarg, left_pad
from thinkrl.rollout.completions import Completions, Sampling
from thinkrl.rollout.engines.lean_decoder import LeanDecoder
from thinkrl.rollout.sampling import draw


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    group_size: int,
    sampling: Sampling,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    record_topk: int = 0,
    record_entropy: bool = False,
    lean: bool = True,
) -> Completions:
    """Completions for each prompt, `group_size` consecutive rows per prompt; optionally the top-K ids and
    log-probs and the entropy of the distribution each token was drawn from (methods that use the sampler
    as their proposal or old policy). lean: decode with thinkrl/rollout/engines/lean_decoder.py when the model supports it
    (the same arithmetic as its transformers forward, less overhead)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    P = len(prompts)
    ids, attn, pos = left_pad(prompts, pad_id, device)  # (P, L): every row's next position is at the end
    # prompts of one length need no mask: without one, the transformers path builds no 4-D mask per decode
    # step (2-10% of a SmolLM2 step on CPU in three alternating checks) and the lean path skips masking
    padded = not bool(attn.all())
    cache = DynamicCache()  # filled in place by every forward below
    kv = {cache_kwarg(model): cache, "use_cache": True}
    out = model(input_ids=ids, attention_mask=attn if padded else None, position_ids=pos, logits_to_keep=1, **kv)
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    logits = out.logits[:, -1].repeat_interleave(group_size, 0)  # (B, V)
    attn = attn.repeat_interleave(group_size, 0)  # (B, L)
    next_pos = pos[:, -1].repeat_interleave(group_size, 0) + 1  # (B,)
    fast = LeanDecoder.for_model(model) if lean and LeanDecoder.supports(model) else None
    if fast is not None:
        fast.start(cache, attn if padded else None, sampling.max_new_tokens)

    B, T = P * group_size, sampling.max_new_tokens
    tokens = torch.full((B, T), pad_id, dtype=torch.long, device=device)
    behav = torch.zeros((B, T), dtype=torch.float32, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    eos = torch.tensor(eos_ids, device=device)
    topk_ids = torch.zeros((B, T, record_topk), dtype=torch.long, device=device) if record_topk else None
    topk_logp = torch.zeros((B, T, record_topk), device=device) if record_topk else None
    entropy = torch.zeros((B, T), device=device) if record_entropy else None
    rows = torch.arange(B, device=device)  # which original rows are still in the decode batch
    for t in range(T):
        if t < sampling.min_new_tokens:  # benchmarks: every row runs to its full length
            logits = logits.index_fill(-1, eos, float("-inf"))
        tok, lp, dist = draw(logits, sampling, generator)  # (b,), (b,), (b, V)
        tokens[rows, t] = tok
        behav[rows, t] = lp
        if record_topk:
            top = dist.topk(min(record_topk, dist.shape[-1]), dim=-1)  # (b, K)
            topk_ids[rows, t], topk_logp[rows, t] = top.indices, top.values.clamp(min=-1e4)  # -inf (truncated) -> finite
        if record_entropy:
            entropy[rows, t] = -torch.where(dist > -torch.inf, dist.exp() * dist, 0.0).sum(-1)
        lengths[rows] += 1
        done = torch.isin(tok, eos)
        finished[rows] |= done
        if t == T - 1 or bool(done.all()):
            break
        if bool(done.any()):  # drop finished rows so later steps only decode live ones
            keep = (~done).nonzero().squeeze(-1)
            if fast is not None:
                fast.select(keep)
            else:
                cache.batch_select_indices(keep)
            rows, tok, attn, next_pos = rows[keep], tok[keep], attn[keep], next_pos[keep]
        if fast is not None:
            logits = fast.step(tok, next_pos)
        else:
            if padded:
                attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=-1)
            logits = model(input_ids=tok[:, None], attention_mask=attn if padded else None, position_ids=next_pos[:, None], **kv).logits[
                :, -1
            ]
        next_pos = next_pos + 1
    T_used = int(lengths.max())
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    cut = lambda x: x[:, :T_used] if x is not None else None  # noqa: E731
    return Completions(cut(tokens), cut(behav), cut(mask), lengths, ~finished, cut(topk_ids), cut(topk_logp), cut(entropy))
