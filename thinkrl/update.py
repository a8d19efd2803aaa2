"""The update phase of one step: rollout batch -> TokenBatches -> method.loss -> optimizer steps.

updates per rollout = train.mini_batches x train.epochs. With one update the policy that sampled the
batch is the policy being updated, so old_logp = logp.detach() exactly and no extra forward is spent;
otherwise old_logp, and whatever else the method requires of pi_old, comes from one no-grad pass before
the first update (thinkrl/proximal.py), after which the method's begin_step sees the whole batch.
Within a mini-batch, sequences are sorted by length and cut into micro-batches of train.micro_batch_size;
losses use the mini-batch's global token and sequence counts, so the split never changes the update.
With several processes (thinkrl/distributed.py) "global" spans the ranks: counts are summed over them, the
loss is scaled by the world size (DDP averages gradients), every rank runs exactly one gradient-synchronising
backward per mini-batch (the others under no_sync), and a rank whose share of a mini-batch is all padding
runs a zero-weight pass so the collectives stay in step.

A mini-batch whose loss or gradient norm is NaN/inf is not applied: its gradients are dropped, it is counted
in update/skipped_nonfinite, and its metrics are left out of the step's averages (train.py stops the run
after train.max_nonfinite_steps steps in a row with nothing applied). The LR schedule still advances, as it
already did for a mini-batch with every token masked. Either choice resumes exactly (scheduler.pt holds the
position); advancing keeps the schedule a clock over the planned updates (steps x mini_batches x epochs), so
the LR at step s is the same in every run of a config and the decay ends with the run, where not advancing
would shift the rest of the schedule by each skip. Adam's step count (its bias correction) advances only
with updates actually applied.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl import correction, distributed, proximal
from thinkrl.batch import TokenBatch
from thinkrl.methods._common import masked_mean
from thinkrl.rollout import Completions


@dataclass
class RolloutBatch:
    prompt_ids: list[list[int]]  # B prompts (each repeated G times)
    comp: Completions  # (B, T) tokens, behav_logp, mask
    advantages: Tensor  # (B,)
    group_size: int  # rows g*G .. g*G+G-1 answer prompt g


def _forward(model, rb: RolloutBatch, rows: Tensor, pad_id: int, temperature: float, topk_ids: Tensor | None):
    """logp, entropy (and log-probs at topk_ids) of the given rows, trimmed to their longest completion.
    `model` is the (wrapped) batch.PolicyLogProbs."""
    T = int(rb.comp.lengths[rows].max())
    prompts = [rb.prompt_ids[i] for i in rows.tolist()]
    ids = topk_ids[rows, :T] if topk_ids is not None else None
    out = model(prompts, rb.comp.tokens[rows, :T], rb.comp.mask[rows, :T], pad_id, temperature, True, ids)
    logp, ent = out[0], out[1]
    return logp, ent, (out[2] if ids is not None else None), T


def update(model, method, optimizer, scheduler, accelerator, rb: RolloutBatch, cfg, pad_id: int, generator, ref_model: Callable | None) -> dict[str, float]:
    tc, temperature = cfg.train, cfg.rollout.temperature
    needs = method.requires
    B = rb.comp.tokens.shape[0]
    lengths = rb.comp.lengths.cpu()
    mask_cpu = rb.comp.mask.cpu()  # token counts from here: no device sync per micro-batch
    policy = accelerator.unwrap_model(model).policy  # no-grad passes need no gradient sync
    world = distributed.world()[1]
    old = proximal.old_policy(policy, rb, method, cfg, pad_id)  # no-op unless the update needs pi_old first
    ref_logp = None
    if "ref_logp" in needs:
        with ref_model() as ref:
            ref_logp = proximal.policy_pass(ref, rb, cfg, pad_id).logp
    sums: dict[str, Tensor] = {}  # detached running sums; .item() once at the end (no per-micro-batch sync)
    step_metrics = method.begin_step(_view(rb, old)) if old.logp is not None else {}

    # a method that takes statistics over the batch it sees (80/20, STAPO) gets the whole mini-batch at once
    micro_size = B if method.batch_statistics else tc.micro_batch_size
    params = [p for p in model.parameters() if p.requires_grad]
    counts = {"tokens": 0, "updates": 0, "skipped": 0}
    model.train()
    for _ in range(tc.epochs):
        # the global RNG is reseeded from (seed, step) each step, so this shuffle is reproducible
        order = torch.randperm(B) if tc.mini_batches > 1 else torch.arange(B)
        for mini in order.tensor_split(tc.mini_batches):  # exactly mini_batches pieces, on every rank
            num_tokens, num_seqs = (int(x) for x in distributed.all_sum([float(mask_cpu[mini].sum()), float(len(mini))]))
            loss_sum, mini_sums, mini_tokens = 0.0, {}, 0  # this mini-batch's; kept only if it is applied
            micros = _micro_batches(mini, order, lengths, mask_cpu, micro_size, rb.group_size, 0 if method.batch_statistics else tc.micro_batch_tokens, num_tokens, world)
            for i, rows in enumerate(micros):
                n = int(mask_cpu[rows].sum())
                sync = contextlib.nullcontext() if world == 1 or i == len(micros) - 1 else accelerator.no_sync(model)
                with sync:
                    if n == 0:  # several processes only: keep this rank's backward count in step with the others'
                        logp = _forward(model, rb, rows, pad_id, temperature, None)[0]
                        accelerator.backward(logp.sum() * 0.0)
                        continue
                    loss, metrics, ent, mask = _micro_loss(model, method, rb, rows, old, ref_logp, cfg, pad_id, generator, num_tokens, num_seqs)
                    accelerator.backward(loss * world)  # DDP averages over ranks; the loss is already over global counts
                loss_sum = loss_sum + loss.detach()
                mini_tokens += n
                _add(mini_sums, "entropy", torch.where(mask, ent, 0.0).sum())
                for k, v in metrics.items():
                    _add(mini_sums, k, v.detach().float() * n)
            if world > 1 and micros:  # the global loss (each rank's part is over global counts): one NaN verdict for all
                loss_sum = torch.tensor(distributed.all_sum([float(loss_sum)])[0])
            trained = not isinstance(loss_sum, float)  # False: every row of this mini-batch was masked
            max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
            grad_norm = accelerator.clip_grad_norm_(params, max_norm)
            # one device sync per optimizer step: a NaN/inf gradient would enter Adam's moments and poison
            # every later update, so it must be caught before optimizer.step()
            finite = not trained or bool(torch.isfinite(grad_norm) & torch.isfinite(loss_sum))
            if finite:
                optimizer.step()
            else:
                counts["skipped"] += 1
            with warnings.catch_warnings():  # torch warns when the schedule moves before any optimizer.step()
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
                scheduler.step()  # also for a skipped update: see the module docstring
            optimizer.zero_grad(set_to_none=True)
            if not (trained and finite):
                continue
            for k, v in mini_sums.items():
                _add(sums, k, v)
            _add(sums, "loss", loss_sum)
            _add(sums, "grad_norm", grad_norm.detach().float())
            counts["tokens"] += mini_tokens
            counts["updates"] += 1
    sums = {k: float(v) for k, v in sums.items()}  # the one host sync for the metrics
    shared = {k: sums.pop(k) for k in ("loss", "grad_norm") if k in sums}  # already equal on every rank
    sums = distributed.sum_dicts({**sums, "_tokens": float(counts["tokens"])})  # token-weighted sums of all ranks
    tokens = sums.pop("_tokens")
    out = {**{k: v / counts["updates"] for k, v in shared.items()}, **{k: v / max(tokens, 1) for k, v in sums.items()}}
    out.update(distributed.mean_dicts({k: float(v) for k, v in step_metrics.items()}))
    if counts["skipped"] and not counts["updates"]:  # nothing applied: show the failure, not a clean 0.0
        out["loss"] = out["grad_norm"] = float("nan")
    out["update/optimizer_steps"] = counts["updates"]
    out["update/skipped_nonfinite"] = counts["skipped"]
    out["lr"] = scheduler.get_last_lr()[0]
    return out


def _micro_batches(mini: Tensor, order: Tensor, lengths: Tensor, mask_cpu: Tensor, size: int, group: int, max_tokens: int, num_tokens: int, world: int) -> list[Tensor]:
    """The micro-batches to run for one mini-batch. One process: those with a token to train on. Several:
    all of them, or one zero-weight row when this rank's share is empty, so that every rank runs at least
    one (gradient-synchronising) backward whenever the global mini-batch has tokens."""
    if num_tokens == 0:
        return []  # nothing anywhere: every rank skips this update
    micros = proximal.micro_batches(mini, lengths, size, group, max_tokens)
    if world == 1:
        return [rows for rows in micros if int(mask_cpu[rows].sum())]
    return micros or [order[:1]]


def _micro_loss(model, method, rb: RolloutBatch, rows: Tensor, old, ref_logp, cfg, pad_id: int, generator, num_tokens: int, num_seqs: int):
    """Forward one micro-batch and apply the method: (loss, metrics, entropy (b, T), mask (b, T))."""
    needs = method.requires
    logp, ent, topk_logp, T = _forward(model, rb, rows, pad_id, cfg.rollout.temperature, old.topk_ids if "topk_logp" in needs else None)
    mask = rb.comp.mask[rows, :T]
    old_logp = old.logp[rows, :T] if old.logp is not None else logp.detach()
    behav = rb.comp.behav_logp[rows, :T]
    cut = lambda x, rows=rows, T=T: x[rows, :T] if x is not None else None  # noqa: E731
    batch = TokenBatch(
        logp=logp,
        old_logp=old_logp,
        behav_logp=behav,
        advantages=rb.advantages[rows],
        mask=mask,
        token_ids=rb.comp.tokens[rows, :T],
        prefix_mask=cut(rb.comp.prefix_mask),
        entropy=ent if "entropy" in needs else None,
        old_entropy=cut(old.entropy) if "old_entropy" in needs else None,
        ref_logp=cut(ref_logp),
        topk_ids=cut(old.topk_ids) if needs & {"topk_ids", "topk_old_logp", "topk_logp"} else None,
        topk_old_logp=cut(old.topk_logp) if needs & {"topk_ids", "topk_old_logp", "topk_logp"} else None,
        topk_logp=topk_logp,
        token_js=cut(old.token_js),
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        generator=generator,
        is_weights=correction.weights(old_logp, behav, mask, cfg.correction),
    )
    loss, metrics = method.loss(batch)
    # the sampler against the trainer: pi_old, or this forward's logp when pi_old is the sampler itself
    trainer_logp = logp.detach() if cfg.train.old_policy == "sampler" else old_logp
    sampled_now = mask if batch.prefix_mask is None else mask & ~batch.prefix_mask  # not historical prefixes
    metrics = {**metrics, **correction.mismatch_stats(trainer_logp, behav, sampled_now)}
    if batch.is_weights is not None:
        metrics["correction/weight_mean"] = masked_mean(batch.is_weights, mask)
        metrics["correction/zero_frac"] = masked_mean(batch.is_weights == 0, mask)
    return loss, metrics, ent, mask


def _view(rb: RolloutBatch, old) -> TokenBatch:
    """The whole rollout batch as a detached TokenBatch, for Method.begin_step."""
    comp = rb.comp
    return TokenBatch(logp=old.logp, old_logp=old.logp, behav_logp=comp.behav_logp, advantages=rb.advantages,
                      mask=comp.mask, token_ids=comp.tokens, old_entropy=old.entropy, prefix_mask=comp.prefix_mask)


def _add(sums: dict[str, Tensor], key: str, value) -> None:
    sums[key] = sums[key] + value if key in sums else value
