"""The update phase (thinkrl/learner/update.py) on the tiny model: what pi_old, the reference, the rollout
correction and the training forward hand each loss call. The losses themselves are tests/methods/."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from dist_update import G, P, global_batch  # tests/dist_update.py: 4 prompts x 3 completions of uneven lengths

import thinkrl.learner.update as update_module
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.logprobs import PolicyLogProbs, dropout_off, token_logprobs
from thinkrl.learner.update import UpdateContext, update
from thinkrl.methods import get_method
from thinkrl.models import add_lora, load_base
from thinkrl.settings import load_config, resolve
from thinkrl.setup import _reference

pytestmark = pytest.mark.plain  # reaches the CPU speed-ups: make test-plain reruns it (tests/plain_marks.py)


def learner(model_dir, method: str, *overrides: str, reference: bool = False, prefix_len=None):
    """(UpdateContext, RolloutBatch) as train.py builds them, with plain SGD at lr 0.5 and LoRA B matrices
    drawn nonzero (at B = 0 the adapters, and so their dropout, change nothing)."""
    opts = {"model.name": str(model_dir), "method.name": method, "output_dir": "unused"}
    cfg = resolve(load_config(None, list(overrides), **opts))
    torch.manual_seed(0)
    base, tok = load_base(str(model_dir), torch.float32)
    policy = add_lora(base, cfg.model.lora)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    method = get_method(cfg.method.name, **cfg.method.params)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = accelerator.prepare(PolicyLogProbs(policy), optimizer, scheduler)
    ref = _reference(cfg, model, accelerator) if reference else None
    ctx = UpdateContext(model, method, optimizer, scheduler, accelerator, cfg, tok.pad_token_id, ref)
    prompts, comp, rewards = global_batch(tok.pad_token_id)
    comp.prefix_len = prefix_len
    adv, _ = compute_advantages(rewards, G, method.advantage, cfg.advantage.eps)
    return ctx, RolloutBatch([prompts[i // G] for i in range(P * G)], comp, adv, G)


def spy(ctx: UpdateContext, monkeypatch) -> list[dict]:
    """Record, for every loss call, its rows and detached copies of the batch fields (in call order)."""
    calls: list[dict] = []
    micro_loss, loss = update_module._micro_loss, ctx.method.loss

    def recording_micro_loss(ctx_, st, rows, *args, **kwargs):
        calls.append({"rows": rows.clone()})
        return micro_loss(ctx_, st, rows, *args, **kwargs)

    def recording_loss(batch):
        for name in ("logp", "old_logp", "ref_logp", "is_weights", "mask", "prefix_mask"):
            value = getattr(batch, name)
            calls[-1][name] = value.detach().clone() if value is not None else None
        return loss(batch)

    monkeypatch.setattr(update_module, "_micro_loss", recording_micro_loss)
    monkeypatch.setattr(ctx.method, "loss", recording_loss)
    return calls


@torch.no_grad()
def policy_logp(model, rb: RolloutBatch, ctx: UpdateContext) -> torch.Tensor:
    """log pi(y_t) (B, T) of the whole rollout batch under `model`, dropout off."""
    with dropout_off(model):
        return token_logprobs(model, rb.prompt_ids, rb.comp.tokens, rb.comp.mask, ctx.pad_id, ctx.cfg.rollout.temperature).logp


def rows_of(call: dict, full: torch.Tensor) -> torch.Tensor:
    """The slice of a (B, T) tensor of the whole batch that a recorded call covers."""
    return full[call["rows"], : call["logp"].shape[1]]


def test_pi_old_is_frozen_across_mini_batches_and_epochs(tiny_model_dir, monkeypatch):
    # 2 mini-batches x 2 epochs = 4 optimizer steps; pi_old is the policy before the first of them, for every call
    ctx, rb = learner(tiny_model_dir, "grpo", "train.mini_batches=2", "train.epochs=2")
    before = policy_logp(ctx.policy, rb, ctx)
    calls = spy(ctx, monkeypatch)
    metrics = update(ctx, rb, torch.Generator().manual_seed(0))
    assert metrics["update/optimizer_steps"] == 4
    seen: dict[int, torch.Tensor] = {}
    for call in calls:
        mask = call["mask"]
        torch.testing.assert_close(call["old_logp"], rows_of(call, before) * mask, rtol=0, atol=1e-5)
        for i, row in zip(call["rows"].tolist(), call["old_logp"]):
            if i in seen:  # the second epoch's pi_old is the first epoch's, bit for bit
                assert torch.equal(row, seen[i])
            seen[i] = row
    assert sorted(seen) == list(range(P * G))
    # the policy did move: the last calls' log-probs are not pi_old's
    drift = max((c["logp"] - c["old_logp"]).abs().max().item() for c in calls[-2:])
    assert drift > 1e-3


def test_first_mini_batch_ratio_is_one_with_lora_dropout(tiny_model_dir, monkeypatch):
    # model.lora.dropout=0.5: pi_old, computed before the first update, and the first mini-batch's training
    # forward must be the same policy, so every ratio is 1 (up to float noise), at step 0 (policy fresh from
    # from_pretrained, in eval mode) and at step 1 (left in train mode by step 0)
    ctx, rb = learner(tiny_model_dir, "grpo", "model.lora.dropout=0.5", "train.mini_batches=2")
    lora_dropout = [m for n, m in ctx.policy.named_modules() if isinstance(m, torch.nn.Dropout) and "lora_dropout" in n]
    assert lora_dropout and all(m.p == 0.5 for m in lora_dropout)
    for step in range(2):
        calls = spy(ctx, monkeypatch)
        update(ctx, rb, torch.Generator().manual_seed(step))
        first = calls[0]  # the first micro-batch of the first mini-batch: no optimizer step before it
        ratio = torch.exp(first["logp"] - first["old_logp"])[first["mask"]]
        torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-5, msg=f"step {step}")
        assert all(m.training for m in lora_dropout)  # dropout_off restores the modules' mode afterwards


def test_reference_log_probs_come_from_the_adapter_disabled_base(tiny_model_dir, monkeypatch):
    ctx, rb = learner(tiny_model_dir, "grpo", "method.beta=0.1", reference=True)
    base, _ = load_base(str(tiny_model_dir), torch.float32)  # the same weights without any adapter
    want = policy_logp(base, rb, ctx)
    refs = []
    for step in range(2):
        calls = spy(ctx, monkeypatch)
        metrics = update(ctx, rb, torch.Generator().manual_seed(step))
        assert "kl/ref" in metrics
        for call in calls:
            torch.testing.assert_close(call["ref_logp"], rows_of(call, want) * call["mask"], rtol=0, atol=1e-5)
        refs.append(calls)
    # the adapters are back on after the reference pass, and the updated policy is not the reference
    after = policy_logp(ctx.policy, rb, ctx)
    assert (after - want).abs().max().item() > 1e-3


def test_thinking_seeds_prefix_tokens_get_no_correction_weight(tiny_model_dir, monkeypatch):
    # correction.mode=tis: continuation tokens (sampled by mu, ratioed against pi_old) get min(pi_old / mu, 2);
    # prefix tokens are ratioed against pi_h = their behav_logp by the method itself, so their weight is 1
    prefix_len = torch.tensor([2, 0, 0, 1, 0, 0, 3, 0, 0, 0, 2, 0])  # (B,)
    ctx, rb = learner(tiny_model_dir, "thinking_seeds", "correction.mode=tis", "train.mini_batches=2", prefix_len=prefix_len)
    calls = spy(ctx, monkeypatch)
    update(ctx, rb, torch.Generator().manual_seed(0))
    prefix_seen = 0
    for call in calls:
        mask, prefix, w = call["mask"], call["prefix_mask"], call["is_weights"]
        behav = rows_of(call, rb.comp.behav_logp)
        tis = torch.exp(call["old_logp"] - behav).clamp(max=2.0)
        assert torch.equal(w[prefix], torch.ones_like(w[prefix]))
        torch.testing.assert_close(w[mask & ~prefix], tis[mask & ~prefix])
        prefix_seen += int(prefix.sum())
    assert prefix_seen == int(prefix_len.sum())
