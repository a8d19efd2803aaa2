"""update() over a fixed global rollout batch, in one process or under torchrun (each rank its share).

    python tests/dist_update.py MODEL_DIR OUT.pt METHOD [--steps N] [--adamw] [-o key=value ...]
    torchrun --nproc_per_node 2 tests/dist_update.py MODEL_DIR OUT.pt METHOD [...]
    accelerate launch --config_file configs/accelerate/fsdp.yaml tests/dist_update.py ...   (FSDP2)

Rank 0 writes {parameter name: change} and each update's metrics to OUT.pt. The optimizer is plain SGD with
lr 1, so the change is minus the applied gradient: Adam's first step is about lr * sign(gradient) and
would hide a gradient that is off by a constant factor (a missing world-size scale, say). --adamw: the
run's AdamW at train.lr instead, whose moments FSDP shards; --steps N: N updates over the same batch;
--nan RANK:STEP: on that rank only, that update's forward returns NaN log-probs (an overflow on one GPU);
--as-run: the policy loaded as a run loads it (models.load_policy) and FSDP2's precision from the config.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

from thinkrl import distributed, sharding
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.logprobs import PolicyLogProbs
from thinkrl.learner.update import UpdateContext, update
from thinkrl.methods import get_method
from thinkrl.models import add_lora, load_base, load_policy, resolve_path, run_dtypes
from thinkrl.rollout.completions import Completions
from thinkrl.settings import load_config, resolve

P, G = 4, 3  # 4 prompts x 3 completions; with 2 ranks, rank r holds prompts 2r and 2r + 1


def global_batch(pad: int) -> tuple[list[list[int]], Completions, torch.Tensor]:
    """Prompts, completions of uneven lengths (rank 1's are longer: more tokens, more micro-batches), rewards."""
    g = torch.Generator().manual_seed(0)
    prompts = [[10 + p, 20 + p, 30, 31 + p][: 3 + p % 2] for p in range(P)]
    lengths = torch.tensor([5, 3, 4, 2, 6, 1, 9, 7, 8, 9, 6, 9])  # (P * G,)
    T = int(lengths.max())
    mask = torch.arange(T)[None] < lengths[:, None]  # (B, T)
    tokens = torch.where(mask, torch.randint(10, 90, (P * G, T), generator=g), pad)
    behav = torch.where(mask, -torch.rand((P * G, T), generator=g) - 0.5, 0.0)
    comp = Completions(tokens, behav, mask, lengths, torch.zeros(P * G, dtype=torch.bool))
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 1])
    return prompts, comp, rewards


def main() -> None:
    model_dir, out, method_name, *rest = sys.argv[1:]
    overrides = [rest[i + 1] for i in range(len(rest) - 1) if rest[i] == "-o"]
    steps = int(rest[rest.index("--steps") + 1]) if "--steps" in rest else 1
    cfg = resolve(load_config(None, overrides, **{"model.name": model_dir, "method.name": method_name, "output_dir": "unused"}))
    as_run = "--as-run" in rest  # the policy as a run loads it: model.dtype computes, float32 masters
    dtypes = functools.partial(run_dtypes, cfg.model) if as_run else None
    accelerator = sharding.accelerator(cpu=True, dtypes=dtypes)
    rank, world = distributed.world()
    torch.manual_seed(0)
    if as_run:
        policy, tok = load_policy(cfg.model, accelerator.device, autocast=not sharding.requested())
    else:
        base, tok = load_base(resolve_path(model_dir), torch.float32)
        policy = add_lora(base, cfg.model.lora) if cfg.model.lora.rank > 0 else base
    with torch.no_grad():  # LoRA's B starts at zero; give it values so every adapter matrix gets a gradient
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    method = get_method(cfg.method.name, **cfg.method.params)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    tc = cfg.train
    optimizer = (
        torch.optim.AdamW(trainable, lr=tc.lr, betas=tuple(tc.adam_betas), weight_decay=tc.weight_decay)
        if "--adamw" in rest
        else torch.optim.SGD(trainable, lr=1.0)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    model, optimizer, scheduler = accelerator.prepare(PolicyLogProbs(policy), optimizer, scheduler)

    prompts, comp, rewards = global_batch(tok.pad_token_id)
    adv, _ = compute_advantages(
        rewards, G, method.advantage if cfg.advantage.estimator == "auto" else cfg.advantage.estimator, cfg.advantage.eps
    )
    groups = distributed.shard(list(range(P)), rank, world)  # this rank's prompts, as the trainer shards them
    rows = torch.tensor([g * G + j for g in groups for j in range(G)])
    rb = RolloutBatch([prompts[r // G] for r in rows.tolist()], comp.select(rows), adv[rows], G)
    if "--nan" in rest:
        _inject_nan(rank, *map(int, rest[rest.index("--nan") + 1].split(":")))
    torch.manual_seed(1)
    ctx = UpdateContext(model, method, optimizer, scheduler, accelerator, cfg, tok.pad_token_id)
    metrics = [update(ctx, rb, torch.Generator().manual_seed(2 + step)) for step in range(steps)]
    after = {n: sharding.full(p.detach()) for n, p in accelerator.unwrap_model(model).policy.named_parameters() if n in before}
    by_rank = distributed.all_gather(metrics)  # every rank's own view of each update (skipped or applied)
    if rank == 0:
        delta = {n: after[n] - b for n, b in before.items()}
        result = {"delta": delta, "metrics": metrics[0] if steps == 1 else metrics, "by_rank": by_rank, "world": world}
        torch.save({**result, "sharded": sharding.is_sharded(model)}, out)
    accelerator.wait_for_everyone()
    distributed.shutdown()
    # The result is on disk. Skip the interpreter's finalisation: under load a gloo thread still joinable when
    # C++ statics are destroyed aborts the rank ("terminate called without an active exception"), which is
    # teardown, not what this script checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _inject_nan(rank: int, bad_rank: int, bad_step: int) -> None:
    """The training forward of rank `bad_rank` returns NaN log-probs during update `bad_step` (1-based)."""
    from thinkrl.learner import logprobs
    from thinkrl.learner import update as update_mod

    real_update, real_logprobs, now = update_mod.update, logprobs.token_logprobs, {"step": 0}

    def counted(*args, **kwargs):
        now["step"] += 1
        return real_update(*args, **kwargs)

    def token_logprobs(*args, **kwargs):
        out = real_logprobs(*args, **kwargs)
        return out._replace(logp=out.logp * float("nan")) if (rank, now["step"]) == (bad_rank, bad_step) else out

    globals()["update"] = counted
    logprobs.token_logprobs = token_logprobs  # what PolicyLogProbs.forward calls


if __name__ == "__main__":
    main()
