"""Two updates of every shipped config over one fixed global batch: in one process, or in each rank of a launch.

    python tests/dist_matrix.py MODEL_DIR OUT.pt CASE [CASE ...]
    accelerate launch --config_file configs/accelerate/fsdp.yaml tests/dist_matrix.py MODEL_DIR OUT.pt CASE ...

A CASE is `NAME` (configs/NAME.yaml as shipped, LoRA rank 16) or `NAME:full` (a full fine-tune), with `+KEY=VALUE`
overrides after it (`grpo+method.beta=0.04`). Each case builds its model, optimizer and reference as
thinkrl/setup.py does, takes its rank's share of tests/dist_update.py's global batch (4 prompts x 3 completions of
uneven length) and runs update() twice: the pi_old pass (mini_batches > 1, begin_step, old_entropy, top-K, JS), the
reference pass (beta > 0) and every loss go through the same Accelerate-wrapped module a run trains. Rank 0 writes
{case: {"metrics": [update 1's, update 2's], "delta": {trained parameter: its change}}} to OUT.pt. One launch
serves every case: a launch costs seconds.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch
from dist_update import G, P, global_batch

from thinkrl import distributed, setup, sharding
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.logprobs import PolicyLogProbs
from thinkrl.learner.old_policy import policy_pass
from thinkrl.learner.update import UpdateContext, update
from thinkrl.models import load_policy
from thinkrl.settings import load_config, resolve_with_method

# How far a sharded or data-parallel update may be from one process's over the same global batch (the test and
# bench/gpu_layouts.py): (relative, absolute) per metric, and the weights after the updates as a share of the
# largest change. Float32 sums taken in another order differ by 1e-7..1e-5 relative in the gradient norm and 2e-7
# in the entropy; AdamW turns gradients near zero into whole steps of either sign: on the bundled model after 3
# updates (tests/test_fsdp.py until this matrix replaced it) the weights differed by 3.0e-6 on an Intel Xeon and
# by 2.2e-5 on an AMD EPYC (both AVX-512) against changes of 6.0e-4. A loss is a sum of per-token terms of size
# about |A| that mostly cancel, so its error follows the terms, not the sum: 5e-7 absolute, or 1e-6 relative for a
# loss far from 0. On an Intel Xeon cispo's 0.598 moved by 1.2e-7 (2 float32 ulps) under both layouts, before this
# bound too, and sapo's 0.036 (terms of 2 |A| / tau) by 1.6e-7 on the fake device.
BOUNDS = {"grad_norm": (1e-4, 0.0), "entropy": (1e-6, 0.0), "loss": (1e-6, 5e-7)}
WEIGHT_SHARE = 0.05
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SHIPPED = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
# beyond the shipped configs: full fine-tunes (with a pi_old pass), the reference pass (LoRA and full), a
# mini-batch split finer than the ranks (a rank with no row in most mini-batches), the batch-statistics
# methods with their selections active on this batch (stapo silencing, stare's gate open, ict by position,
# clip_cov's draw, kl_cov's penalty), and the IcePop and IPO masks (global_batch's
# mu is far from the tiny model's probabilities, so the masks take wide settings)
EXTRA = [
    "grpo:full",
    "gspo:full",
    "grpo+method.beta=0.04",
    "grpo:full+method.beta=0.04",
    "gspo+train.mini_batches=12",
    "stapo+method.tau_p=0.5+method.entropy_quantile=0.75",
    "stare+method.target_entropy=9",
    "ict+method.unit=position",
    "clip_cov+method.clip_ratio=0.2+method.cov_lb=0.0",
    "kl_cov+method.kl_ratio=0.2+train.old_policy=sampler",  # the penalty on a fifth of the tokens (KINKED, below)
    "grpo+correction.mode=icepop+correction.band=[0.03,100.0]",  # about 70% of these tokens masked
    "grpo+correction.mode=ipo+correction.eps=0.4",  # about 40% masked
]
# kl_cov as shipped recomputes pi_old for its 4 mini-batches, and the kink of its |log r| turns that pass's float
# noise into +-kl_coef gradients that differ with the layout (docs/methods.md, kl_cov): here its pi_old is mu
KINKED = {"kl_cov": "kl_cov+train.old_policy=sampler"}
CASES = [KINKED.get(name, name) for name in SHIPPED] + EXTRA


def case_config(case: str, model_dir: str):
    """The config and method of one case: the shipped file, the tiny model, fp32, the case's LoRA rank and overrides."""
    name, *extra = case.split("+")
    name, _, kind = name.partition(":")
    overrides = [f"model.lora.rank={0 if kind == 'full' else 16}", "model.dtype=float32", "train.gradient_checkpointing=false", *extra]
    return resolve_with_method(load_config(CONFIGS / f"{name}.yaml", overrides, **{"model.name": model_dir, "output_dir": "unused"}))


def run_case(case: str, model_dir: str, accelerator) -> dict:
    cfg, method = case_config(case, model_dir)  # the method as a run resolves it (norm_length from the budget)
    rank, world = distributed.world()
    torch.manual_seed(0)
    policy, tok = load_policy(cfg.model, accelerator.device)
    with torch.no_grad():  # LoRA's B starts at zero; give it values so the adapters, and so the reference, differ
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    prompts, comp, rewards = global_batch(tok.pad_token_id)
    comp = on(comp, accelerator.device)  # where an engine leaves completions (a GPU in bench/gpu_layouts.py)
    if cfg.train.old_policy == "sampler":  # what a sampler records: the starting policy's top-K and entropy
        comp = recorded(policy, prompts, comp, cfg, method, tok.pad_token_id)
    tc = cfg.train
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr, betas=tuple(tc.adam_betas), weight_decay=tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    model, optimizer, scheduler = accelerator.prepare(PolicyLogProbs(policy), optimizer, scheduler)
    ref = setup._reference(cfg, model, accelerator) if "ref_logp" in method.requires else None
    estimator = method.advantage if cfg.advantage.estimator == "auto" else cfg.advantage.estimator
    adv, _ = compute_advantages(rewards, G, estimator, cfg.advantage.eps)
    groups = distributed.shard(list(range(P)), rank, world)
    rows = torch.tensor([g * G + j for g in groups for j in range(G)])
    device = accelerator.device
    rb = RolloutBatch([prompts[r // G] for r in rows.tolist()], comp.select(rows), adv[rows].to(device), G)
    ctx = UpdateContext(model, method, optimizer, scheduler, accelerator, cfg, tok.pad_token_id, ref)
    trained = lambda: accelerator.unwrap_model(model).policy.named_parameters()  # noqa: E731  (shards under FSDP2)
    before = {n: sharding.full(p.detach()).cpu().clone() for n, p in trained() if p.requires_grad}  # every rank gathers
    metrics = []
    for step in range(2):
        torch.manual_seed(1 + step)  # the step's seed, the same on every rank (mini-batch shuffles)
        metrics.append(update(ctx, rb, torch.Generator().manual_seed(2 + step)))
    delta = {n: sharding.full(p.detach()).cpu() - before[n] for n, p in trained() if n in before}
    accelerator.free_memory()
    return {"metrics": metrics, "delta": delta}


def recorded(policy, prompts, comp, cfg, method, pad: int):
    """comp with the top-K and entropy a sampler would have recorded, here from the starting weights (whole batch,
    before sharding: the same on every rank)."""
    rb = RolloutBatch([prompts[r // G] for r in range(P * G)], comp, torch.zeros(P * G, device=comp.tokens.device), G)
    old = policy_pass(policy, rb, cfg, pad, entropy=True, K=method.topk_width)
    return dataclasses.replace(comp, topk_ids=old.topk_ids, topk_logp=old.topk_logp, entropy=old.entropy)


def on(comp, device):
    """The completions on `device`, where an engine leaves them."""
    return dataclasses.replace(
        comp, **{f.name: getattr(comp, f.name).to(device) for f in dataclasses.fields(comp) if getattr(comp, f.name) is not None}
    )


def mismatches(one: dict, two: dict, case: str) -> list[str]:
    """How `two` (a launch's result) differs from `one` (one process's) in `case` beyond the bounds above."""
    a, b, out = one["results"][case], two["results"][case], []
    for step, (x, y) in enumerate(zip(a["metrics"], b["metrics"], strict=True), 1):
        if not x["update/optimizer_steps"] == y["update/optimizer_steps"] > 0 or y["update/skipped_nonfinite"]:
            out.append(f"update {step}: optimizer steps {x['update/optimizer_steps']} vs {y['update/optimizer_steps']}")
        for key, (rel, abs_) in BOUNDS.items():
            if abs(x[key] - y[key]) > max(rel * abs(x[key]), abs_):
                out.append(f"update {step}: {key} {x[key]:.8g} vs {y[key]:.8g}")
    moved = max((float(d.abs().max()) for d in a["delta"].values()), default=0.0)  # in step with the learning rate
    if a["delta"].keys() != b["delta"].keys() or moved == 0:
        return [*out, "the trained parameters differ or did not move"]
    for name, delta in a["delta"].items():
        gap = float((b["delta"][name].float() - delta.float()).abs().max())
        if gap > WEIGHT_SHARE * moved:
            out.append(f"{name}: weights differ by {gap:.3g} (largest change {moved:.3g})")
    return out


def main() -> None:
    model_dir, out, *cases = sys.argv[1:]
    accelerator = sharding.accelerator(cpu=not torch.cuda.is_available())
    results = {case: run_case(case, model_dir, accelerator) for case in cases}
    if distributed.is_main():
        torch.save({"results": results, "world": distributed.world()[1], "type": str(accelerator.distributed_type)}, out)
    accelerator.wait_for_everyone()
    distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/dist_update.py: skip gloo's teardown, which now and then aborts under load


if __name__ == "__main__":
    main()
