"""Everything a run needs before its first step: data, model, method, optimizer, sampler, engine.

Cheap checks come first, so a missing dataset file, a missing column or a bad prompt template fails in a
second, before any model loads; and nothing is written until setup has worked: the run directory appears
only when training starts (`open_run_dir`), so a failed start leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from thinkrl import sharding
from thinkrl.config import Config
from thinkrl.data import build_prompts, fit_context, load_problems, model_context, template_note, uses_chat
from thinkrl.errors import UserError
from thinkrl.learner.logprobs import PolicyLogProbs
from thinkrl.learner.update import UpdateContext
from thinkrl.methods import Method
from thinkrl.models import compute_dtype, load_base, load_policy, load_tokenizer, parameter_counts, resolve_path
from thinkrl.rollout.engines import Engine, check_engine, describe_path, engine_for_run
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.run import checkpoint, faults, resume
from thinkrl.run.agreement import AgreementCheck, comparison_dtype
from thinkrl.run.atomic import write_atomic
from thinkrl.run.console import console, shown
from thinkrl.run.lock import DirLock
from thinkrl.settings import save_config
from thinkrl.verifier.rewards import RewardSet


@dataclass
class Setup:
    policy: Any  # the transformers / peft model being trained
    tok: Any
    method: Method
    prompts: list
    data_report: dict
    learner: UpdateContext  # model (wrapped), optimizer, scheduler, ...
    sampler: PolicySampler
    engine: Engine
    seed_pool: Any  # thinkrl.rollout.seeds.SeedPool or None
    start: int  # steps already done (resume)
    rewards: RewardSet  # reward.functions, imported and checked
    agreement: AgreementCheck  # does the engine sample what the trainer scores (thinkrl/run/agreement.py)


def reseed(seed: int, step: int, device: torch.device, rank: int = 0) -> torch.Generator:
    """Reseed every RNG from (seed, step): any step replays identically, so resume needs no RNG files. The
    sampling generator also mixes in the process rank, so ranks draw independent completions."""
    s = (seed * 1_000_003 + step) % 2**63
    random.seed(s)
    torch.manual_seed(s)
    return torch.Generator(device=device).manual_seed((s + 7_919 * rank) % 2**63)


def lr_lambda(cfg, total: int):
    def f(i: int) -> float:
        if i < cfg.warmup_steps:
            return (i + 1) / cfg.warmup_steps
        frac = (i - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
        return {"constant": 1.0, "linear": 1.0 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[cfg.schedule]

    return f


NO_ROOM = "prompt + max_new_tokens over the context"  # the skip reason of a prompt the budget does not fit beside


def prepare_data(cfg: Config, tok, context: int | None = None) -> tuple[list, dict]:
    """The training prompts and what was skipped (written to data_report.json once the run starts). A prompt is
    kept when it is at most data.max_prompt_tokens long and leaves rollout.max_new_tokens in the model's
    context (`context`; default: read from the model's config), since a step decodes every prompt with the
    whole budget (eval instead clips each prompt's budget, thinkrl/evaluation/evaluate.py)."""
    context = context or model_context_of(cfg.model.name, tok)
    check_budget(cfg, context)
    loaded = load_problems(cfg.data)
    for line in loaded.warnings:  # a benchmark copy with another row count than the benchmark's
        console.print(f"[yellow]warning: {shown(line)}[/]", soft_wrap=True)
    note = template_note(tok, cfg.prompt)
    if note:
        console.print(f"[yellow]{note}[/]", soft_wrap=True)
    prompts, too_long = build_prompts(loaded.problems, tok, cfg.prompt, cfg.data.max_prompt_tokens)
    prompts, no_room = fit_context(prompts, context, cfg.rollout.max_new_tokens)
    skipped = {**loaded.skipped, **({"prompt too long": too_long} if too_long else {}), **({NO_ROOM: no_room} if no_room else {})}
    d, r = cfg.data, cfg.rollout
    if not prompts and not no_room:
        raise UserError(f"every prompt of {d.name} is longer than data.max_prompt_tokens={d.max_prompt_tokens}; raise it")
    if not prompts:
        raise UserError(
            f"no prompt of {d.name} leaves room for rollout.max_new_tokens={r.max_new_tokens} in the {context}-token context of "
            f"model {cfg.model.name} ({too_long} over data.max_prompt_tokens={d.max_prompt_tokens}, {no_room} too long for the "
            "context beside the budget); lower rollout.max_new_tokens"
        )
    parts = [f"{n} {why}" + (f" ({loaded.where[why]})" if why in loaded.where else "") for why, n in skipped.items()]
    console.print(f"data: {shown(d.name)}: {len(prompts)} prompts, skipped: {shown(', '.join(parts) or 'none')}", soft_wrap=True)
    template = "chat" if uses_chat(tok, cfg.prompt) else "plain"
    report = {"dataset": d.name, "source": loaded.origin, "sha256": loaded.sha256, "used": len(prompts), "skipped": skipped}
    report["skipped_where"] = loaded.where
    return prompts, {**report, "template": template, "context_window": context}


def model_context_of(name: str, tok) -> int | None:
    """The model's context window from its config.json, before any weights load (None: not known)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolve_path(name))
    except Exception:  # an architecture this transformers lacks, say: loading the model names the real problem
        config = None
    return model_context(config, tok)


def check_budget(cfg: Config, context: int | None) -> None:
    """rollout.max_new_tokens against the model's context, before the model loads: a budget that leaves no room
    for any prompt is refused; one that, with data.max_prompt_tokens, is past the context clips the prompt
    limit to the rest (longer prompts are skipped and counted), and a warning says so."""
    budget, limit = cfg.rollout.max_new_tokens, cfg.data.max_prompt_tokens
    if context is None or budget + limit <= context:
        return
    model = shown(cfg.model.name)
    if budget >= context:
        room = context - min(limit, context // 2)
        raise UserError(
            f"rollout.max_new_tokens={budget} leaves no room for a prompt in the {context}-token context of model "
            f"{cfg.model.name}; set it below {context} (-o rollout.max_new_tokens={room} leaves {context - room} tokens for the prompt)"
        )
    console.print(
        f"[yellow]warning: data.max_prompt_tokens={limit} + rollout.max_new_tokens={budget} is past the {context}-token context of "
        f"model {model}, so prompts are limited to {context - budget} tokens (longer ones are skipped and counted); lower either to fit[/]",
        soft_wrap=True,
    )


def check_writable(run_dir: Path) -> None:
    """An --output-dir that can never be written (a file in the way, a read-only disk) fails before any work."""
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    if not existing.is_dir():
        error: OSError = NotADirectoryError(errno.ENOTDIR, "Not a directory", str(existing))
    elif not os.access(existing, os.W_OK | os.X_OK):
        error = PermissionError(errno.EACCES, "Permission denied", str(existing))
    else:
        return
    raise UserError(faults.cannot_write(error, run_dir, run_dir, started=False))


def prepare(cfg: Config, method: Method, accelerator, run_dir: Path, ckpt: Path | None) -> Setup:
    """Data and reward functions first (cheap, and the usual mistakes), then model, method, optimizer, sampler and engine."""
    check_engine(cfg.rollout.engine)  # a missing vLLM: before the model (or the bundled one's conversion) loads
    tok = load_tokenizer(resolve_path(cfg.model.name))
    prompts, report = prepare_data(cfg, tok)
    rewards = RewardSet(cfg.reward.functions, cfg.reward.max_failure_share)  # one that cannot be imported or called fails here
    device = accelerator.device
    reseed(cfg.train.seed, 0, device)  # the loop's rule: the LoRA init is part of the run's seed
    policy, tok = load_policy(cfg.model, device, autocast=not sharding.requested())  # FSDP2 casts itself (sharding.py)
    trainable, total = parameter_counts(policy)
    console.print(
        f"model: {cfg.model.name} on {device} in {weight_dtypes(policy)}, {trainable:,} of {total:,} parameters trainable", soft_wrap=True
    )
    tc, rc = cfg.train, cfg.rollout
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr, betas=tuple(tc.adam_betas), weight_decay=tc.weight_decay)
    total_updates = tc.steps * tc.mini_batches * tc.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tc, total_updates))
    if ckpt is not None and sharding.requested():  # before FSDP shards them: rank 0 reads, the others receive
        sharding.load_weights(lambda: checkpoint.load_weights(ckpt, policy), policy)
    elif ckpt is not None:
        checkpoint.load_weights(ckpt, policy)
    # the sampler's own copy is made from the whole weights too; under FSDP it samples with a copy always
    copy = cfg.seeds.enabled or sharding.requested()
    sampler = PolicySampler(policy, rc.precision, rc.staleness, copy_always=copy, adapters_only=rc.engine == "vllm_server")
    # the training forward goes through `model` (DDP/FSDP see it); sampling and checkpoints use `policy`
    model, optimizer, scheduler = accelerator.prepare(PolicyLogProbs(policy), optimizer, scheduler)
    policy = accelerator.unwrap_model(model).policy
    ref_model = _reference(cfg, model, accelerator) if "ref_logp" in method.requires else None
    learner = UpdateContext(model, method, optimizer, scheduler, accelerator, cfg, tok.pad_token_id, ref_model)
    seed_pool = _seed_pool(cfg, run_dir, accelerator.process_index) if cfg.seeds.enabled else None
    start = 0
    if ckpt is not None:
        sharded = sharding.is_sharded(model)
        load_optimizer = (lambda state: sharding.load_optimizer(model, optimizer, state)) if sharded else None
        read = not sharded or accelerator.is_main_process  # FSDP: rank 0 reads optimizer.pt and broadcasts it
        checkpoint.load_state(ckpt, optimizer, scheduler, method, sampler, seed_pool, load_optimizer, read)
        start = checkpoint.checkpoint_step(ckpt)  # trainer_state.json agrees with it (intact.verify)
        _use_config_hyperparameters(optimizer, scheduler, tc, total_updates)
        console.print(f"resuming {run_dir} from {ckpt.name}")
    engine = engine_for_run(cfg, device, sampler.model)  # refused here for a model the engine would sample wrongly
    path = describe_path(engine, sampler.model)  # auto's choice, and whether lean's fused decoder runs this model
    console.print(f"sampling: {shown(path.line())}", soft_wrap=True)
    report["sampling"] = path.record()  # config.yaml keeps rollout.engine as written; data_report.json what it became
    agreement = AgreementCheck(cfg, path.engine, path.decoder, comparison_dtype(sampler.model))
    return Setup(policy, tok, method, prompts, report, learner, sampler, engine, seed_pool, start, rewards, agreement)


def weight_dtypes(policy) -> str:
    """The dtypes a run trains in: one name when weights and compute agree (float32 on a CPU), else the
    trained weights' (masters, model.master_dtype), the compute dtype (model.dtype) and LoRA's frozen base:
    'float32 masters, bfloat16 compute' (a full fine-tune on CUDA), '..., bfloat16 frozen base' (LoRA)."""
    name = lambda dtypes: ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))  # noqa: E731
    frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
    trained = {p.dtype for p in policy.parameters() if p.requires_grad}
    compute = compute_dtype(policy)
    if frozen | trained | {compute} == {compute}:
        return name({compute})
    return f"{name(trained)} masters, {name({compute})} compute" + (f", {name(frozen)} frozen base" if frozen else "")


def open_run_dir(
    cfg: Config, run_dir: Path, report: dict, main: bool, locks: contextlib.ExitStack | None = None, resumed: int | None = None
) -> None:
    """Create the run directory and write its config and data report: only once setup has worked. With
    `locks` (rank 0 of a run whose directory did not exist at start) the directory's lock is taken into it
    first (thinkrl/run/lock.py), and a run another process made there meanwhile is refused, not overwritten.
    `resumed` (a resume: the step it continues from) records what the resume changed in changes.jsonl before
    config.yaml takes the new values (thinkrl/run/resume.py). Every file is written atomically;
    config.yaml last, so a directory holding it has set up."""
    with faults.writes(run_dir, run_dir, started=resumed is not None):
        run_dir.mkdir(parents=True, exist_ok=True)
        if locks is not None:
            locks.enter_context(DirLock(run_dir, "training run"))
            if (run_dir / "metrics.jsonl").exists():
                raise UserError(f"{run_dir} was made a run directory by another process while this one set up; pick a new --output-dir")
        if main:
            if resumed is not None:
                resume.record(run_dir, resumed, cfg)
            write_atomic(run_dir / "data_report.json", json.dumps(report, indent=2))
            save_config(cfg, run_dir / "config.yaml")


def _use_config_hyperparameters(optimizer, scheduler, tc, total_updates: int) -> None:
    """A checkpoint restores the optimizer's LR, betas and weight decay as they were saved; the config wins,
    so `--resume RUN_DIR -o train.lr=...` (the fix for a diverging run) takes effect. The schedule keeps its
    position: the LR becomes train.lr x schedule(position), exactly what an unchanged config had anyway."""
    sched = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps the torch scheduler
    factor = lr_lambda(tc, total_updates)(sched.last_epoch)
    sched.base_lrs = [tc.lr for _ in optimizer.param_groups]
    for group in optimizer.param_groups:
        group.update(initial_lr=tc.lr, lr=tc.lr * factor, betas=tuple(tc.adam_betas), weight_decay=tc.weight_decay)


def _seed_pool(cfg: Config, run_dir: Path, rank: int):
    from thinkrl.rollout.seeds import SeedPool

    on_disk = cfg.seeds.storage == "disk" or (cfg.seeds.storage == "auto" and cfg.model.lora.rank == 0)
    # with several processes on one disk, each keeps its own files
    return SeedPool(cfg.seeds, run_dir / "seeds" / (f"rank-{rank}" if rank else ""), on_disk)


def _reference(cfg: Config, root, accelerator):
    """Context manager factory yielding the reference policy's root module (learner/logprobs.py PolicyLogProbs),
    whose forward its no-grad pass runs in: with LoRA the trainer's own root with the adapters disabled; for a
    full fine-tune the base model loaded again, sharded like the policy under FSDP2 (a whole copy per device
    otherwise), frozen."""
    if cfg.model.lora.rank > 0:
        return lambda: _adapters_off(root, accelerator.unwrap_model(root).policy)
    policy = accelerator.unwrap_model(root).policy
    ref, _ = load_base(cfg.model.name, compute_dtype(policy))  # frozen: no masters, the dtype the policy computes in
    ref_root = PolicyLogProbs(ref.to(accelerator.device).eval().requires_grad_(False))
    if sharding.is_sharded(root):
        ref_root = sharding.shard_frozen(ref_root, root, accelerator)
    return lambda: contextlib.nullcontext(ref_root)


@contextlib.contextmanager
def _adapters_off(root, policy):
    with policy.disable_adapter():
        yield root
