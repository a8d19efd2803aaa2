"""The update phase of one step: rollout batch -> TokenBatches -> method.loss -> optimizer steps.

updates per rollout = train.mini_batches x train.epochs. With one update old_logp = logp.detach() and no extra
forward is spent; otherwise pi_old comes from one no-grad pass first (old_policy.py). Micro-batches use the
mini-batch's global token and sequence counts, so the cut never changes the update. Every forward runs in
train mode with dropout off, a non-finite mini-batch is skipped, and with several processes the counts span
the ranks: the reasons for each rule are in docs/architecture.md ("The update phase"). The phase runs inside
accel.update_pass (CPU speed-ups); the code here is the plain path a GPU runs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from thinkrl import accel, distributed
from thinkrl.batch import TokenBatch
from thinkrl.config import Config
from thinkrl.learner import correction, method_calls
from thinkrl.learner.batching import RolloutBatch, mini_batch_rows, update_passes
from thinkrl.learner.logprobs import LogProbs, activation_bytes, dropout_off, recompute_bytes
from thinkrl.learner.old_policy import OldPolicy, old_policy, policy_pass
from thinkrl.methods import Method
from thinkrl.ops import masked_mean
from thinkrl.sharding import full, is_sharded

ACTIVATION_BUDGET = 2**30  # bytes of activations one pass may keep before auto checkpointing recomputes them


@dataclass
class UpdateContext:
    """What the update phase works with; train.py builds it once."""

    model: Any  # the (Accelerate-wrapped) PolicyLogProbs: the training forward goes through it, so DDP/FSDP see it
    method: Method
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LR scheduler (Accelerate wraps it)
    accelerator: Any
    cfg: Config
    pad_id: int
    ref_model: Callable | None = None  # context-manager factory yielding the reference's root module (methods needing ref_logp)
    sharded: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        # FSDP2 reduce-scatters each micro-batch's gradient instead of skipping the sync: no_sync would keep whole
        # unsharded gradients until the last micro-batch (a whole model's worth per device)
        self.sharded = is_sharded(self.model)

    @property
    def policy(self):
        """The transformers / peft model itself: no-grad passes need no gradient sync."""
        return self.accelerator.unwrap_model(self.model).policy


@dataclass
class _Step:
    """One update phase's inputs and running totals."""

    rb: RolloutBatch
    old: OldPolicy
    ref_logp: Tensor | None
    generator: torch.Generator
    lengths: Tensor  # (B,) on the CPU
    mask: Tensor  # (B, T) on the CPU: token counts from here, no device sync per micro-batch
    sums: dict[str, Tensor]  # detached running sums; .item() once at the end (no per-micro-batch sync)
    tokens: int = 0
    updates: int = 0
    skipped: int = 0
    agree: dict[str, Tensor] = field(default_factory=dict)  # |log rho| sum and count over tokens scored with the sampler's weights
    uniform: Tensor | None = None  # (B, T) this epoch's per-token draws (methods that require "uniform")


def update(ctx: UpdateContext, rb: RolloutBatch, generator: torch.Generator) -> dict[str, float]:
    """Every optimizer step of one training step on rollout batch rb; returns the step's update metrics."""
    tc, method = ctx.cfg.train, ctx.method
    ctx.model.train()  # before the pi_old pass too: one mode for every pass (module docstring)
    with dropout_off(ctx.model), accel.update_pass(ctx.policy):
        # both no-grad passes run inside the root module's forward (logprobs.through_root), as FSDP2 needs
        old = old_policy(ctx.model, rb, method, ctx.cfg, ctx.pad_id)  # nothing unless the update needs pi_old first
        ref_logp = None
        if "ref_logp" in method.requires and ctx.ref_model is not None:
            with ctx.ref_model() as ref:
                ref_logp = policy_pass(ref, rb, ctx.cfg, ctx.pad_id).logp
        step_metrics = method_calls.begin_step(method, _view(rb, old)) if old.logp is not None else {}
        st = _Step(rb, old, ref_logp, generator, rb.comp.lengths.cpu(), rb.comp.mask.cpu(), {})
        B = rb.comp.tokens.shape[0]
        for epoch in range(tc.epochs):
            st.uniform = _uniform(rb, epoch) if "uniform" in method.requires else None
            for mini in mini_batch_rows(B, tc.mini_batches, epoch):  # exactly mini_batches pieces, on every rank
                _mini_batch(ctx, st, mini, torch.arange(B))
    return _metrics(ctx, st, step_metrics)


def _mini_batch(ctx: UpdateContext, st: _Step, mini: Tensor, order: Tensor) -> None:
    """Forward and backward every micro-batch of one mini-batch, then one optimizer step (or a skip)."""
    tc, method, accelerator = ctx.cfg.train, ctx.method, ctx.accelerator
    world = distributed.world()[1]
    num_tokens, num_seqs = (int(x) for x in distributed.all_sum([float(st.mask[mini].sum()), float(len(mini))]))
    # a method that takes statistics over the batch it sees (80/20, STAPO) gets the whole mini-batch at once
    size = len(st.lengths) if method.batch_statistics else tc.micro_batch_size
    cap = 0 if method.batch_statistics else tc.micro_batch_tokens
    micros = update_passes(mini, order, st.lengths, st.mask, size, st.rb.group_size, cap, num_tokens, world)
    loss_sum: Tensor | float = 0.0
    sums: dict[str, Tensor] = {}  # this mini-batch's; kept only if it is applied
    tokens = 0
    pooled = world > 1 and method.batch_statistics  # its loss gathers statistics from every rank (TokenBatch.gather)
    for i, rows in enumerate(micros):
        stand_in = not len(mini)  # an empty share runs another row at weight 0 (update_passes)
        n = 0 if stand_in else int(st.mask[rows].sum())
        synced = world == 1 or i == len(micros) - 1 or ctx.sharded  # FSDP2: every micro-batch (UpdateContext)
        sync = contextlib.nullcontext() if synced else accelerator.no_sync(ctx.model)
        with sync:
            if n == 0 and not pooled:  # several processes only: keep this rank's backward count in step with the others'
                accelerator.backward(_forward(ctx, st.rb, rows, None)[0].logp.sum() * 0.0)
                continue
            # a pooling loss runs on every rank, over no token here, so its gathers stay in step
            loss, metrics, ent, mask = _micro_loss(ctx, st, rows, num_tokens, num_seqs, pooled, masked=n == 0)
            accelerator.backward(loss * world)  # DDP averages over ranks; the loss is already over global counts
        if n == 0:
            continue
        loss_sum = loss_sum + loss.detach()
        tokens += n
        _add(sums, "entropy", torch.where(mask, ent, 0.0).sum())
        for k, v in metrics.items():
            _add(sums, k, v.detach().float() * n)
    if world > 1 and micros:  # the global loss (each rank's part is over global counts): one NaN verdict for all
        loss_sum = torch.tensor(distributed.all_sum([float(loss_sum)])[0])
    trained = isinstance(loss_sum, Tensor)  # False: every row of this mini-batch was masked
    params = [p for p in ctx.model.parameters() if p.requires_grad]
    # one number over every shard under FSDP, so all ranks reach the same verdict below
    grad_norm = full(accelerator.clip_grad_norm_(params, tc.grad_clip if tc.grad_clip > 0 else float("inf")))
    # one device sync per optimizer step: a NaN/inf gradient would enter Adam's moments and poison every
    # later update, so it must be caught before optimizer.step()
    finite = not trained or bool(torch.isfinite(grad_norm) & torch.isfinite(torch.as_tensor(loss_sum)))
    if finite:
        ctx.optimizer.step()
    else:
        st.skipped += 1
    with warnings.catch_warnings():  # torch warns when the schedule moves before any optimizer.step()
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        ctx.scheduler.step()  # also for a skipped update: see the module docstring
    ctx.optimizer.zero_grad(set_to_none=True)
    if trained and finite:
        for k, v in sums.items():
            _add(st.sums, k, v)
        _add(st.sums, "loss", torch.as_tensor(loss_sum))
        _add(st.sums, "grad_norm", grad_norm.detach().float())
        st.tokens += tokens
        st.updates += 1


def _forward(
    ctx: UpdateContext, rb: RolloutBatch, rows: Tensor, topk_ids: Tensor | None, entropy_grad: bool = False
) -> tuple[LogProbs, int]:
    """log-probs and entropy (and log-probs at topk_ids) of the given rows, trimmed to their longest completion;
    the entropy carries its gradient only with entropy_grad (the head's extra backward work is spent only then)."""
    T = int(rb.comp.lengths[rows].max())
    prompts = [rb.prompt_ids[i] for i in rows.tolist()]
    ids = topk_ids[rows, :T] if topk_ids is not None else None
    recompute, keep = _checkpointing(ctx, len(rows) * T)
    comp, temperature = rb.comp, ctx.cfg.rollout.temperature
    out = ctx.model(
        prompts, comp.tokens[rows, :T], comp.mask[rows, :T], ctx.pad_id, temperature, True, ids, recompute, keep, entropy_grad=entropy_grad
    )
    return out, T


def _checkpointing(ctx: UpdateContext, tokens: int) -> tuple[bool, frozenset]:
    """Whether this pass recomputes its layers in the backward, and the (in, out) shapes of the linear layers
    whose outputs the recompute reuses instead (thinkrl/accel): train.gradient_checkpointing (true: none kept),
    or with auto, checkpointing when the pass's activations would pass ACTIVATION_BUDGET, keeping as many linear
    outputs as the rest of the budget holds. Either way the values are the same (logprobs.py)."""
    setting = ctx.cfg.train.gradient_checkpointing
    if setting != "auto":
        return bool(setting), frozenset()
    policy = ctx.policy
    size = next(policy.parameters()).element_size()
    if activation_bytes(policy.config, tokens, size) <= ACTIVATION_BUDGET:
        return False, frozenset()
    room = ACTIVATION_BUDGET - recompute_bytes(policy.config, tokens, size)
    return True, accel.kept_linears(policy, tokens, size, room)


def _micro_loss(ctx: UpdateContext, st: _Step, rows: Tensor, num_tokens: int, num_seqs: int, pooled: bool = False, masked: bool = False):
    """Forward one micro-batch and apply the method: (loss, metrics, entropy (b, T), mask (b, T)). `pooled`: the
    loss gathers batch statistics from every rank; `masked`: no token of these rows is trained (a stand-in)."""
    rb, old, cfg, needs = st.rb, st.old, ctx.cfg, ctx.method.requires
    coef = cfg.train.entropy_coef
    out, T = _forward(ctx, rb, rows, old.topk_ids if "topk_logp" in needs else None, ctx.method.entropy_grad or coef > 0)
    logp, ent = out.logp, out.entropy
    assert ent is not None  # the training forward always computes it (metrics)
    mask = rb.comp.mask[rows, :T] & (not masked)
    old_logp = old.logp[rows, :T] if old.logp is not None else logp.detach()
    behav = rb.comp.behav_logp[rows, :T]
    topk = bool(needs & {"topk_ids", "topk_old_logp", "topk_logp"})

    def cut(x: Tensor | None) -> Tensor | None:
        return x[rows, :T] if x is not None else None

    prefix = cut(rb.comp.prefix_mask)
    exempt = prefix if ctx.method.mismatch_corrected == "prefix" else None  # tokens the method corrects itself
    batch = TokenBatch(
        logp=logp,
        old_logp=old_logp,
        behav_logp=behav,
        advantages=rb.advantages[rows],
        mask=mask,
        token_ids=rb.comp.tokens[rows, :T],
        prefix_mask=prefix,
        entropy=(ent if ctx.method.entropy_grad else ent.detach()) if "entropy" in needs else None,  # gating methods: no grad
        old_entropy=cut(old.entropy) if "old_entropy" in needs else None,
        ref_logp=cut(st.ref_logp),
        topk_ids=cut(old.topk_ids) if topk else None,
        topk_old_logp=cut(old.topk_logp) if topk else None,
        topk_logp=out.topk_logp,
        token_js=cut(old.token_js),
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        generator=st.generator,
        uniform=cut(st.uniform),
        gather=distributed.gather_rows if pooled else None,
        is_weights=correction.weights(old_logp, behav, mask, cfg.correction, exempt),
    )
    loss, metrics = method_calls.loss(ctx.method, batch)  # its return value checked: a plugin's mistake is one line
    if coef > 0:  # over the mini-batch's global token count, as the losses divide: the micro-batch cut changes nothing
        loss = loss - coef * torch.where(mask, ent, 0.0).sum() / num_tokens
        metrics = {**metrics, "update/entropy_bonus": coef * masked_mean(ent, mask)}  # token-weighted across micro-batches
    # the sampler against the trainer: pi_old, or this forward's logp when pi_old is the sampler itself
    trainer_logp = logp.detach() if cfg.train.old_policy == "sampler" else old_logp
    sampled_now = mask if batch.prefix_mask is None else mask & ~batch.prefix_mask  # not historical prefixes
    stats = correction.mismatch_stats(trainer_logp, behav, sampled_now)
    metrics = {**metrics, **stats}
    if cfg.train.old_policy != "sampler" or st.updates == 0:  # trainer_logp is of the weights that sampled: no update yet
        _add(st.agree, "_agree_sum", stats["mismatch/abs_log_ratio"] * sampled_now.sum())
        _add(st.agree, "_agree_tokens", sampled_now.sum())
    if batch.is_weights is not None:
        metrics["correction/weight_mean"] = masked_mean(batch.is_weights, mask)
        metrics["correction/zero_frac"] = masked_mean(batch.is_weights == 0, mask)
    return loss, metrics, ent.detach(), mask


def _metrics(ctx: UpdateContext, st: _Step, step_metrics: dict[str, Tensor]) -> dict[str, float]:
    """The step's update metrics: loss and grad_norm per applied update, the rest token-weighted over ranks."""
    sums = {k: float(v) for k, v in {**st.sums, **st.agree}.items()}  # the one host sync for the metrics
    shared = {k: sums.pop(k) for k in ("loss", "grad_norm") if k in sums}  # already equal on every rank
    sums = distributed.sum_dicts({**sums, "_tokens": float(st.tokens)})  # token-weighted sums of all ranks
    tokens, agree_sum, agree_tokens = (sums.pop(k, 0.0) for k in ("_tokens", "_agree_sum", "_agree_tokens"))
    out = {**{k: v / st.updates for k, v in shared.items()}, **{k: v / max(tokens, 1) for k, v in sums.items()}}
    out.update(distributed.mean_dicts({k: float(v) for k, v in step_metrics.items()}))
    if st.skipped and not st.updates:  # nothing applied: show the failure, not a clean 0.0
        out["loss"] = out["grad_norm"] = float("nan")
    out.update({} if tokens else {"entropy": float("nan")})  # no token of an applied update: not measured, never 0.0
    out["update/optimizer_steps"] = st.updates
    out["update/skipped_nonfinite"] = st.skipped
    out["lr"] = ctx.scheduler.get_last_lr()[0]
    if agree_tokens:  # the sampler/trainer agreement check keeps it on the steps it checks (thinkrl/run/agreement.py)
        out["mismatch/agreement_gap"] = agree_sum / agree_tokens
    return out


def _view(rb: RolloutBatch, old: OldPolicy) -> TokenBatch:
    """The whole rollout batch as a detached TokenBatch, for Method.begin_step: with several processes, every
    rank's rows (distributed.gather_rows), so a method's step statistics and controller state are those of the
    global batch, the same on every rank and at any process count."""
    comp = rb.comp
    assert old.logp is not None
    whole = lambda x: distributed.gather_rows(x)[0] if x is not None else None  # noqa: E731
    logp = whole(old.logp)
    return TokenBatch(
        logp=logp,
        old_logp=logp,
        behav_logp=whole(comp.behav_logp),
        advantages=whole(rb.advantages),
        mask=whole(comp.mask),
        token_ids=whole(comp.tokens),
        old_entropy=whole(old.entropy),
        prefix_mask=whole(comp.prefix_mask),
    )


def _uniform(rb: RolloutBatch, epoch: int) -> Tensor:
    """(B, T) one U(0, 1) per token of this rank's rows for the epoch: drawn for the whole global batch from a
    generator every rank seeds alike (the step's seed and the epoch, as mini_batch_rows), so a token's draw
    depends on neither the micro-batch cut nor the process count."""
    B, T = rb.comp.tokens.shape
    sizes = distributed.all_gather((B, T))
    g = torch.Generator().manual_seed((torch.initial_seed() * 1_000_003 + 7 * epoch + 1) % 2**63)
    draws = torch.rand((sum(b for b, _ in sizes), max(t for _, t in sizes)), generator=g)  # (B_global, T_max)
    start = sum(b for b, _ in sizes[: distributed.world()[0]])
    return draws[start : start + B, :T].to(rb.comp.tokens.device)


def _add(sums: dict[str, Tensor], key: str, value: Tensor) -> None:
    sums[key] = sums[key] + value if key in sums else value
