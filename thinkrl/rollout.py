"""Sample G completions per prompt with the KV cache, recording each token's behaviour log-prob.

behav_logp is log mu(y_t) under the distribution the token was actually drawn from: softmax(logits / T)
after top-k / top-p truncation (greedy: the untempered softmax). Each prompt is prefilled once and its cache
repeated G times; rows that have emitted EOS leave the decode batch, so a batch costs what its longest
completion costs only for the rows still running.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.batch import cache_kwarg, left_pad
from thinkrl.fastdecode import LeanDecoder


@dataclass
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0  # EOS is suppressed before this many tokens (fixed-length benchmarks)


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
        return Completions(cut(self.tokens), cut(self.behav_logp), cut(self.mask), self.lengths[rows], self.truncated[rows],
                           cut(self.topk_ids), cut(self.topk_logp), cut(self.entropy), pick(self.prefix_len), pick(self.seed_step))

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
            join("tokens", pad_id), join("behav_logp", 0.0), join("mask", False),
            torch.cat([p.lengths for p in parts]), torch.cat([p.truncated for p in parts]),
            join("topk_ids", 0), join("topk_logp", 0.0), join("entropy", 0.0),
            *(torch.cat([getattr(p, name) for p in parts]) if getattr(parts[0], name) is not None else None for name in ("prefix_len", "seed_step")),
        )


def _sample(logits: Tensor, s: Sampling, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """Draw one token per row; return ids (B,), their log-probs (B,) and the whole log-distribution (B, V)
    they were drawn from (tempered and truncated; -inf outside the top-k / top-p set)."""
    logits = logits.float()  # (B, V)
    if s.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        ids = logp.argmax(-1)
        return ids, logp.gather(-1, ids[:, None]).squeeze(-1), logp
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
    logp = torch.log_softmax(logits, -1)  # (B, V)
    # Inverse-CDF draw: one uniform per row. (torch.multinomial over a 49k vocabulary cost ~20 ms per call
    # on CPU, a third of a decode step.) right=True never lands on a zero-probability token.
    cdf = logp.exp().cumsum(-1)  # (B, V)
    u = torch.rand((logits.shape[0], 1), generator=generator, device=logits.device) * cdf[:, -1:]  # (B, 1)
    ids = torch.searchsorted(cdf, u, right=True).clamp(max=logits.shape[-1] - 1).squeeze(-1)  # (B,)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1), logp


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
    as their proposal or old policy). lean: decode with thinkrl/fastdecode.py when the model supports it
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
        tok, lp, dist = _sample(logits, sampling, generator)  # (b,), (b,), (b, V)
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
            logits = model(input_ids=tok[:, None], attention_mask=attn if padded else None, position_ids=next_pos[:, None], **kv).logits[:, -1]
        next_pos = next_pos + 1
    T_used = int(lengths.max())
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    cut = lambda x: x[:, :T_used] if x is not None else None  # noqa: E731
    return Completions(cut(tokens), cut(behav), cut(mask), lengths, ~finished, cut(topk_ids), cut(topk_logp), cut(entropy))
