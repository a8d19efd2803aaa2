"""The update phase of one step: rollout batch -> TokenBatches -> method.loss -> optimizer steps.

updates per rollout = train.mini_batches x train.epochs. With one update the policy that sampled the
batch is the policy being updated, so old_logp = logp.detach() exactly and no extra forward is spent;
otherwise old_logp (and old_entropy when the method asks) is recomputed once, before the first update.
Within a mini-batch, sequences are sorted by length and cut into micro-batches of train.micro_batch_size;
losses use the mini-batch's global token and sequence counts, so the split never changes the update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl import correction
from thinkrl.batch import TokenBatch, token_logprobs
from thinkrl.methods._common import masked_mean
from thinkrl.rollout import Completions


@dataclass
class RolloutBatch:
    prompt_ids: list[list[int]]  # B prompts (each repeated G times)
    comp: Completions  # (B, T) tokens, behav_logp, mask
    advantages: Tensor  # (B,)
    group_size: int  # rows g*G .. g*G+G-1 answer prompt g


def _micro_batches(rows: Tensor, lengths: Tensor, size: int, group_size: int) -> list[Tensor]:
    """Rows ordered by prompt group, longest completion first within a group, cut into micro-batches:
    a group's completions share one prompt forward, and similar lengths pad less."""
    key = (rows // group_size) * (lengths.max() + 1) - lengths[rows]
    order = rows[torch.argsort(key, stable=True)]
    return list(order.split(size))


def _forward(model, rb: RolloutBatch, rows: Tensor, pad_id: int, temperature: float, entropy: bool):
    """logp and entropy of the given rows, trimmed to their longest completion."""
    T = int(rb.comp.lengths[rows].max())
    prompts = [rb.prompt_ids[i] for i in rows.tolist()]
    logp, ent = token_logprobs(model, prompts, rb.comp.tokens[rows, :T], rb.comp.mask[rows, :T], pad_id, temperature, entropy)
    return logp, ent, T


@torch.no_grad()
def _full_pass(model, rb: RolloutBatch, size: int, pad_id: int, temperature: float, entropy: bool) -> tuple[Tensor, Tensor]:
    """(B, T) log-probs and entropies of the whole rollout batch under `model`, without grad."""
    B, T = rb.comp.tokens.shape
    logp = torch.zeros((B, T), device=rb.comp.tokens.device)
    ent = torch.zeros((B, T), device=rb.comp.tokens.device)
    for rows in _micro_batches(torch.arange(B), rb.comp.lengths.cpu(), size, rb.group_size):
        lp, e, t = _forward(model, rb, rows, pad_id, temperature, entropy)
        logp[rows, :t] = lp
        if e is not None:
            ent[rows, :t] = e
    return logp, ent


def update(model, method, optimizer, scheduler, accelerator, rb: RolloutBatch, cfg, pad_id: int, generator, ref_model: Callable | None) -> dict[str, float]:
    tc, temperature = cfg.train, cfg.rollout.temperature
    needs = method.requires
    B = rb.comp.tokens.shape[0]
    lengths = rb.comp.lengths.cpu()
    mask_cpu = rb.comp.mask.cpu()  # token counts from here: no device sync per micro-batch
    recompute = tc.mini_batches * tc.epochs > 1 or "old_entropy" in needs
    old_logp = old_ent = ref_logp = None
    if recompute:
        old_logp, old_ent = _full_pass(model, rb, tc.micro_batch_size, pad_id, temperature, "old_entropy" in needs)
    if "ref_logp" in needs:
        with ref_model() as ref:
            ref_logp, _ = _full_pass(ref, rb, tc.micro_batch_size, pad_id, temperature, False)

    # a method that takes statistics over the batch it sees (80/20, STAPO) gets the whole mini-batch at once
    micro_size = B if getattr(type(method), "batch_statistics", False) else tc.micro_batch_size
    params = [p for p in model.parameters() if p.requires_grad]
    sums: dict[str, Tensor] = {}  # detached running sums; .item() once at the end (no per-micro-batch sync)
    counts = {"tokens": 0, "updates": 0}
    model.train()
    for _ in range(tc.epochs):
        # the global RNG is reseeded from (seed, step) each step, so this shuffle is reproducible
        order = torch.randperm(B) if tc.mini_batches > 1 else torch.arange(B)
        for mini in order.chunk(tc.mini_batches):
            num_tokens, num_seqs = int(mask_cpu[mini].sum()), len(mini)
            loss_sum = 0.0
            for rows in _micro_batches(mini, lengths, micro_size, rb.group_size):
                n = int(mask_cpu[rows].sum())
                if n == 0:
                    continue  # every token masked (e.g. mask_truncated): nothing to learn from these rows
                logp, ent, T = _forward(model, rb, rows, pad_id, temperature, entropy=True)
                mask = rb.comp.mask[rows, :T]
                old = old_logp[rows, :T] if recompute else logp.detach()
                behav = rb.comp.behav_logp[rows, :T]
                batch = TokenBatch(
                    logp=logp,
                    old_logp=old,
                    behav_logp=behav,
                    advantages=rb.advantages[rows],
                    mask=mask,
                    entropy=ent if "entropy" in needs else None,
                    old_entropy=old_ent[rows, :T] if "old_entropy" in needs else None,
                    ref_logp=ref_logp[rows, :T] if ref_logp is not None else None,
                    num_tokens=num_tokens,
                    num_seqs=num_seqs,
                    generator=generator,
                    is_weights=correction.weights(old, behav, mask, cfg.correction),
                )
                loss, metrics = method.loss(batch)
                metrics = {**metrics, **correction.mismatch_stats(old, behav, mask)}
                if batch.is_weights is not None:
                    metrics["correction/weight_mean"] = masked_mean(batch.is_weights, mask)
                    metrics["correction/zero_frac"] = masked_mean(batch.is_weights == 0, mask)
                accelerator.backward(loss)
                loss_sum = loss_sum + loss.detach()
                counts["tokens"] += n
                _add(sums, "entropy", torch.where(mask, ent, 0.0).sum())
                for k, v in metrics.items():
                    _add(sums, k, v.detach().float() * n)
            max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
            grad_norm = accelerator.clip_grad_norm_(params, max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if isinstance(loss_sum, float):
                continue  # nothing was trained in this mini-batch
            _add(sums, "loss", loss_sum)
            _add(sums, "grad_norm", grad_norm.detach().float())
            counts["updates"] += 1
    out = {k: (v / counts["updates"]) if k in ("loss", "grad_norm") else v / max(counts["tokens"], 1) for k, v in sums.items()}
    out = {k: float(v) for k, v in out.items()}
    out["lr"] = scheduler.get_last_lr()[0]
    return out


def _add(sums: dict[str, Tensor], key: str, value) -> None:
    sums[key] = sums[key] + value if key in sums else value
