"""The learner's update of the tiny model on the fake device: forward, loss, backward, AdamW step, and the
pi_old and reference passes, with the tensors train.py puts on the device (the model, the rollout batch, the
advantages) there. Each run must match the same update on the CPU, so the fake changes no number."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from accelerate import Accelerator
from dist_matrix import BOUNDS, CONFIGS, SHIPPED, WEIGHT_SHARE, recorded
from dist_update import G, P, global_batch  # tests/dist_update.py: 4 prompts x 3 completions of uneven lengths
from fakedevice import DeviceTensor

from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.logprobs import PolicyLogProbs
from thinkrl.learner.update import UpdateContext, update
from thinkrl.models import add_lora, load_base
from thinkrl.settings import load_config, resolve_with_method
from thinkrl.setup import _reference, reseed

pytestmark = pytest.mark.device


def run_update(
    model_dir, device: torch.device, method: str, *overrides: str, config: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One update phase with AdamW on `device`, as train.py runs it; (trained parameters after it on the CPU, metrics).
    `config`: a shipped configs/NAME.yaml instead of `method` with the defaults."""
    names = {"model.name": str(model_dir), "output_dir": "unused", **({} if config else {"method.name": method})}
    cfg, method_obj = resolve_with_method(load_config(CONFIGS / f"{config}.yaml" if config else None, list(overrides), **names))
    torch.manual_seed(0)
    base, tok = load_base(str(model_dir), torch.float32)
    policy = add_lora(base, cfg.model.lora)
    with torch.no_grad():  # LoRA's B starts at zero; nonzero, the reference pass (adapters off) differs from the policy's
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    run_update.start = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}  # the last call's
    policy.to(device)
    method = method_obj
    tc = cfg.train
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=tc.lr, betas=tuple(tc.adam_betas))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    accelerator = Accelerator(cpu=True, device_placement=False)  # Accelerate knows no fakegpu: the model is placed above
    model, optimizer, scheduler = accelerator.prepare(PolicyLogProbs(policy), optimizer, scheduler)
    ref = _reference(cfg, model, accelerator) if "ref_logp" in method.requires else None
    ctx = UpdateContext(model, method, optimizer, scheduler, accelerator, cfg, tok.pad_token_id, ref)
    prompts, comp, rewards = global_batch(tok.pad_token_id)
    on_device = {f.name: getattr(comp, f.name).to(device) for f in dataclasses.fields(comp) if getattr(comp, f.name) is not None}
    comp = dataclasses.replace(comp, **on_device)
    if cfg.train.old_policy == "sampler":  # the top-K and entropy a sampler records, here from the starting weights
        comp = recorded(policy, prompts, comp, cfg, method, tok.pad_token_id)
    adv, _ = compute_advantages(rewards.to(device), G, method.advantage, cfg.advantage.eps)
    rb = RolloutBatch([prompts[i // G] for i in range(P * G)], comp, adv, G)
    metrics = update(ctx, rb, reseed(cfg.train.seed, 1, device))
    trained = {n: p.detach().cpu() for n, p in policy.named_parameters() if p.requires_grad}
    assert all(isinstance(p, DeviceTensor) for p in policy.parameters()) == (device.type != "cpu")
    return trained, metrics


CASES = {  # method, overrides, optimizer steps
    "grpo": ("grpo", [], 1),  # one update: pi_old is this forward's log-probs
    "pi_old pass": ("grpo", ["train.mini_batches=2"], 2),  # a no-grad pass first
    "reference pass": ("grpo", ["method.beta=0.04"], 1),  # the base model with the LoRA adapters disabled
    # top-K of pi_old, and random draws from the step's generator (on the device) in the loss
    "sis": ("sis", ["train.mini_batches=2", "train.old_policy=recompute"], 2),
}


@pytest.mark.parametrize("method, overrides, steps", CASES.values(), ids=CASES.keys())
def test_update_on_the_device_matches_the_cpu(tiny_model_dir, fakegpu, method, overrides, steps):
    on_device, metrics = run_update(tiny_model_dir, fakegpu, method, *overrides)
    on_cpu, cpu_metrics = run_update(tiny_model_dir, torch.device("cpu"), method, *overrides)
    assert metrics["update/optimizer_steps"] == cpu_metrics["update/optimizer_steps"] == steps
    assert ("kl/ref" in metrics) == ("method.beta=0.04" in overrides)
    assert metrics["loss"] == pytest.approx(cpu_metrics["loss"], rel=1e-5, abs=1e-7)
    for name, p in on_device.items():
        torch.testing.assert_close(p, on_cpu[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("config", SHIPPED)
def test_every_shipped_config_updates_on_the_device_as_on_the_cpu(tiny_model_dir, fakegpu, config):
    """configs/NAME.yaml as shipped (LoRA): its pi_old pass, begin_step, top-K, JS, per-token draws and loss on the device."""
    on_device, metrics = run_update(tiny_model_dir, fakegpu, "", config=config)
    on_cpu, cpu_metrics = run_update(tiny_model_dir, torch.device("cpu"), "", config=config)
    assert metrics["update/optimizer_steps"] == cpu_metrics["update/optimizer_steps"] > 0
    for key, (rel, abs_) in BOUNDS.items():  # the fake runs other kernels (decomposed ops): float32 sums in another order
        assert metrics[key] == pytest.approx(cpu_metrics[key], rel=rel, abs=abs_), key
    # AdamW turns gradients near zero into whole steps of either sign: weights within a share of the largest change
    moved = max(float((p - run_update.start[n]).abs().max()) for n, p in on_cpu.items())
    assert moved > 0
    for name, p in on_device.items():
        torch.testing.assert_close(p, on_cpu[name], rtol=0, atol=WEIGHT_SHARE * moved, msg=name)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "sapo", "gmpo"])
def test_a_direct_call_with_the_devices_generator_and_no_uniform_stays_on_the_device(fakegpu, name):
    # the probe calls a loss without batch.uniform and with the run's sampling generator, which lives on the device:
    # clip_cov then draws its own numbers, with that generator, where it lives (on the CPU it would raise)
    from thinkrl.batch import TokenBatch
    from thinkrl.methods import get_method

    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(4, 6, generator=g) * 3).to(fakegpu).requires_grad_()
    old = logp.detach() + 0.1
    mask = torch.ones(4, 6, dtype=torch.bool).to(fakegpu)
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(4, 6).contiguous().to(fakegpu)
    on_device = torch.Generator(device=fakegpu).manual_seed(1)
    batch = TokenBatch(logp=logp, old_logp=old, behav_logp=old, advantages=adv, mask=mask, generator=on_device)
    loss, _ = get_method(name, **({"clip_ratio": 0.5, "cov_lb": -9.0} if name == "clip_cov" else {})).loss(batch)
    loss.backward()
    assert loss.device == fakegpu and logp.grad is not None and logp.grad.device == fakegpu
