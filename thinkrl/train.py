"""The GRPO-family training loop, read top to bottom.

Each step: take prompts_per_step prompts, sample group_size completions for each with the current policy
(recording behaviour log-probs), grade them in verifier worker processes, turn rewards into group-relative
advantages, and update the policy with the chosen method's loss (thinkrl/methods/<name>.py). The loop never
looks at the method's name: what a method needs beyond log-probs it declares in `method.requires`.

Run:  thinkrl train                      (bundled SmolLM2-135M-Instruct, built-in arithmetic, grpo)
      thinkrl train configs/demo.yaml --method dapo -o train.steps=100

Failures end the run with one line (a UserError, exit 2) that says what to change, and never cost the last
complete checkpoint: train.max_nonfinite_steps steps in a row of NaN/inf updates (checkpoint, then stop), a
failed write (disk full, unwritable --output-dir), GPU out of memory (nothing new saved). SIGINT/SIGTERM
finish the step, checkpoint, and print the resume command (exit 0). One process at a time uses a run
directory: a second one (a resume of a running run) fails in one line naming the first (thinkrl/run/lock.py).

Resume (thinkrl/run/resume.py): a change to what makes the run (resume.GUARDED: model, method, data, reward,
sampling, loss, seeds) is refused unless allow_changes; every change is printed and recorded in RUN_DIR/changes.jsonl;
config.yaml is rewritten only once the resumed run has set up. A damaged newest checkpoint is named in one line
and the newest intact one is used (thinkrl/run/intact.py). A new run refuses an --output-dir holding a
run or other files.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape

from thinkrl import accel, distributed, setup, sharding
from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.evaluation.evaluate import eval_during_training
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.update import update
from thinkrl.models import eos_ids, run_dtypes
from thinkrl.rollout.collect import RolloutContext, RolloutPlan, collect
from thinkrl.run import checkpoint, faults, intact, lock, records, trackers
from thinkrl.run import resume as resuming
from thinkrl.run.console import console, progress, shown, step_line
from thinkrl.run.jsonl import JsonlLog
from thinkrl.settings import on_policy_note, recipe_report, resolve_with_method
from thinkrl.verifier import load_grader
from thinkrl.verifier.shielded import ShieldedPool


def train(cfg: Config, resume: bool = False, allow_changes: bool = False) -> Path:
    accel.process_start()  # on a CPU: allocator settings and the freed-block cache (thinkrl/accel)
    with contextlib.ExitStack() as held:  # the run directory's lock (thinkrl/run/lock.py), released however the run ends
        return _train(cfg, resume, held, allow_changes)


@dataclass
class _Run:
    """What every step of one run works with."""

    cfg: Config
    s: setup.Setup
    accelerator: Any
    run_dir: Path
    rank: int
    rollout: RolloutContext
    estimator: str
    metrics_log: JsonlLog
    rollouts_log: JsonlLog
    step: int  # steps done
    phase: str = "setup"  # what the step was doing, for an out-of-memory message


def _accelerator(cfg: Config):
    """The run's Accelerator: its process group, and FSDP2's precision policy from the model's dtypes on its device."""
    dtypes = functools.partial(run_dtypes, cfg.model)
    return sharding.accelerator(not torch.cuda.is_available(), dtypes, **trackers.accelerator_kwargs(cfg.log, Path(cfg.output_dir)))


def _train(cfg: Config, resume: bool, held: contextlib.ExitStack, allow_changes: bool = False) -> Path:
    recipe, (cfg, method) = recipe_report(cfg), resolve_with_method(cfg)  # the recipe as loaded; the method built once
    # several processes (torchrun / accelerate launch): Accelerate sets up the process group and wraps (or,
    # with FSDP, shards: thinkrl/sharding.py) the model; thinkrl/distributed.py says which prompts are this
    # rank's; only rank 0 writes
    accelerator = _accelerator(cfg)
    distributed.set_device(accelerator.device)  # the collectives' tensors: NCCL, on GPUs, serves CUDA tensors only
    cfg.output_dir = distributed.all_gather(cfg.output_dir)[0]  # a default name is made per process: every rank takes rank 0's
    run_dir = Path(cfg.output_dir)
    rank, world = distributed.world()
    main = rank == 0
    console.quiet = not main
    _announce(cfg, resume, world, recipe)
    locked = main and run_dir.is_dir()  # rank 0 locks a directory that exists before reading its checkpoint,
    if locked:  # and a new one as soon as setup has worked and created it (setup.open_run_dir)
        with faults.writes(run_dir / lock.NAME, run_dir, started=False):
            held.enter_context(lock.DirLock(run_dir, "training run"))
    ckpt, damaged = _checkpoint_to_resume(cfg, run_dir, resume, allow_changes)
    setup.check_writable(run_dir)
    grade_fn = load_grader(cfg.verifier.grader)  # a bad grader fails here, before config.yaml is written

    # --- setup: data, model, method, optimizer, sampler, engine; the run directory appears once they work
    s = setup.prepare(cfg, method, accelerator, run_dir, ckpt)
    accelerator.wait_for_everyone()  # every rank has set up before rank 0 writes anything
    setup.open_run_dir(cfg, run_dir, s.data_report, main, held if main and not locked else None, s.start if resume else None)
    held.push(resuming.forget_failed_start(run_dir, main and not resume))  # a start that fails before step 1 leaves no run
    if main and damaged:
        with faults.writes(run_dir / "checkpoints", run_dir):
            for moved in intact.set_aside([bad for bad, _ in damaged]):
                console.print(f"set the damaged checkpoint aside as {escape(str(moved))}; delete it when done with it", soft_wrap=True)
    trackers.start(accelerator, cfg)
    start, estimator = s.start, method.advantage if cfg.advantage.estimator == "auto" else cfg.advantage.estimator
    metrics_log, rollouts_log = JsonlLog(run_dir / "metrics.jsonl"), JsonlLog(run_dir / "rollouts.jsonl")
    for log in (metrics_log, rollouts_log) if main else ():
        log.truncate_after(start)
    flag, run = faults.StopFlag(), None
    try:
        with (
            ShieldedPool(cfg.verifier.workers, cfg.verifier.timeout, grade_fn=grade_fn) as pool,
            progress() as bar,
        ):
            eos, recorded = eos_ids(s.policy, s.tok), _sampler_records(method, cfg)
            plan = RolloutPlan.from_config(cfg)
            rollout = RolloutContext(
                plan, s.engine, s.sampler, s.tok, pool, s.rewards, eos, s.tok.pad_token_id, **recorded, seed_pool=s.seed_pool
            )
            run = _Run(cfg, s, accelerator, run_dir, rank, rollout, estimator, metrics_log, rollouts_log, start)
            _steps(run, pool, bar, flag)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError, as are older torch's OOM errors
        if not faults.is_out_of_memory(e):
            raise
        step, phase = (run.step, run.phase) if run else (start, "setup")
        raise UserError(faults.out_of_memory_message(cfg, step + 1, phase, run_dir)) from e
    finally:
        flag.restore()
        s.engine.close()
        accelerator.end_training()  # flush and close the trackers
        distributed.shutdown()
    console.print(f"run directory: {run_dir}")
    return run_dir


def _steps(run: _Run, pool, bar, flag: faults.StopFlag) -> None:
    """Train from run.step to train.steps, checkpointing every save_every steps, at the end, on a signal
    (then stop) and when updates keep failing (then stop with the error)."""
    tc = run.cfg.train
    task = bar.add_task(run.cfg.method.name, total=tc.steps, completed=run.step, info="")
    nonfinite = 0  # steps in a row whose every update was skipped
    for step in range(run.step, tc.steps):
        run.step = step
        record, upd = _step(run, step, pool)
        nonfinite = faults.nonfinite_streak(nonfinite, upd)
        bar.console.print(step_line(record, tc.steps), soft_wrap=True)
        bar.update(task, advance=1, info=f"reward {record['reward/mean']:.3f}")
        done = step + 1 == tc.steps
        diverged = 0 < tc.max_nonfinite_steps <= nonfinite
        stop = distributed.all_max(float(flag.stop)) > 0  # a signal seen by any rank stops them all
        if done or (tc.save_every and (step + 1) % tc.save_every == 0) or stop or diverged:
            _save(run, step + 1)
            run.accelerator.wait_for_everyone()
        if diverged:  # the checkpoint holds the last good weights: skipped updates changed nothing
            dtype = str(next(run.s.policy.parameters()).dtype).removeprefix("torch.")
            raise UserError(faults.nonfinite_message(run.cfg, step + 1, nonfinite, run.run_dir, dtype))
        if stop and not done:
            # soft_wrap: never wrapped at the console width, so the command stays one copyable line in a log file
            console.print(escape(f"stopped after step {step + 1}; continue with: {resuming.resume_command(run.run_dir)}"), soft_wrap=True)
            return


def _announce(cfg: Config, resume: bool, world: int, recipe: str) -> None:
    """The run's first lines (where, what, the recipe's every key), and the one check that needs the process count."""
    console.print(run_summary(cfg, resume), soft_wrap=True)
    if not resume:  # a resumed run's config.yaml already holds every key; the recipe was reported at its start
        console.print(escape(recipe), soft_wrap=True)
    note = on_policy_note(cfg)
    if note:
        console.print(f"[yellow]{note}[/]", soft_wrap=True)
    if cfg.rollout.prompts_per_step % world:
        raise UserError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be a multiple of the {world} processes "
            "(each takes whole groups); change it or the process count"
        )


def _checkpoint_to_resume(cfg: Config, run_dir: Path, resume: bool, allow_changes: bool) -> tuple[Path | None, list]:
    """The newest intact checkpoint of a resumed run (None: start from step 0) and the damaged ones newer than
    it; for a new run, the check that --output-dir may hold it."""
    if not resume:
        resuming.check_new_run_dir(run_dir)  # an existing run (use --resume) or the user's own files
        return None, []
    ckpt, damaged = intact.latest_intact(run_dir)
    resuming.check(run_dir, cfg, allow_changes, checkpoint.checkpoint_step(ckpt) if ckpt else 0)  # what makes the run may not change
    for bad, problem in damaged:  # never used: set aside as checkpoints/damaged-step-N once setup has worked
        console.print(f"[yellow]note: {escape(problem)}: {bad.name} is damaged, so the run resumes from {ckpt.name}[/]", soft_wrap=True)
    if ckpt is None:
        console.print(f"no complete checkpoint in {run_dir}: starting from step 0")
    return ckpt, damaged


def _step(run: _Run, step: int, pool) -> tuple[dict, dict]:
    """One training step (step + 1): rollout, scores, advantages, update, evaluation, logs. Returns the step's
    record (its metrics.jsonl line) and the update's metrics."""
    cfg, s, rc, main = run.cfg, run.s, run.cfg.rollout, run.rank == 0
    t0 = time.perf_counter()
    generator = setup.reseed(cfg.train.seed, step + 1, run.accelerator.device, run.rank)

    # 1-2. rollout and score: G completions per prompt with behaviour log-probs, rewards (B,)
    run.phase = "generation"
    s.sampler.refresh()
    if s.seed_pool is not None and s.seed_pool.due(step):  # Thinking Seeds: every seeds.every steps the policy joins the pool
        s.seed_pool.maybe_add(step, s.sampler.snapshot())
    samples = collect(run.rollout, step, s.prompts, generator)
    G = samples.group_size  # one source for every stage below
    t2 = time.perf_counter()

    # 3. advantages (B,) and 4. update (skipped when dynamic sampling kept no group)
    run.phase = "update"
    upd, adv, astats = {}, torch.zeros(0), {}
    if samples.prompts:
        adv, astats = compute_advantages(samples.rewards, G, run.estimator, cfg.advantage.eps)
    if distributed.all_sum([float(not samples.prompts)])[0] == 0:  # every rank kept a group: all update
        comp = samples.comp
        if rc.mask_truncated:  # DAPO's overlong filtering: truncated completions teach nothing
            comp = replace(comp, mask=comp.mask & ~comp.truncated[:, None])
        prompt_ids = [p.ids for p in samples.prompts for _ in range(G)]
        upd = update(s.learner, RolloutBatch(prompt_ids, comp, adv.to(run.accelerator.device), G), generator)
    t3 = time.perf_counter()
    s.agreement.check(step + 1, upd)  # the engine against the trainer: warns once on a gap rounding cannot explain

    # 5. evaluate (eval.every), log
    evals = {}
    if cfg.eval.every and ((step + 1) % cfg.eval.every == 0 or step + 1 == cfg.train.steps):
        run.phase = "evaluation"
        model = s.sampler.refresh(current=True)  # on every rank: under FSDP the rebuild gathers from all of them
        if main:
            evals = eval_during_training(model, s.tok, cfg, run.run_dir, step + 1, pool, s.engine)
            evals["time/eval"] = time.perf_counter() - t3
    record = records.step_record(step + 1, samples, upd, astats, {"time/update": t3 - t2, "time/step": t3 - t0, **evals})
    if main:
        with faults.writes(run.metrics_log.path, run.run_dir):
            run.metrics_log.write(record)
        run.accelerator.log(trackers.loggable(record), step=step + 1)
    if cfg.log.rollouts_every and (step + 1) % cfg.log.rollouts_every == 0:
        lines = records.rollout_records(step + 1, samples, adv, G)
        if main:
            with faults.writes(run.rollouts_log.path, run.run_dir):
                run.rollouts_log.write(lines)
    return record, upd


def _save(run: _Run, step: int) -> None:
    """Checkpoint `step` (rank 0); a failed write gives its temporary directory's space back at once."""
    cfg, s, run_dir = run.cfg, run.s, run.run_dir
    model = s.learner.model
    gathered = sharding.gathered(model, s.learner.optimizer, s.sampler.lora) if sharding.is_sharded(model) else None  # every rank
    if run.rank != 0:
        return
    state = {"seed": cfg.train.seed, "method": cfg.method.name}
    try:
        with faults.writes(run_dir / "checkpoints" / f"step-{step}", run_dir):
            learner = s.learner
            args = (s.policy, s.tok, learner.optimizer, learner.scheduler, s.method, state, cfg.train.keep_last, s.sampler, s.seed_pool)
            checkpoint.save(run_dir, step, *args, gathered)
    except UserError:
        with contextlib.suppress(OSError):  # the half-written temporary directory: give its space back now
            checkpoint.remove_stale(run_dir)
        raise


def run_summary(cfg: Config, resume: bool) -> str:
    """The first line a run prints: where it writes and what it trains."""
    r, t = cfg.rollout, cfg.train
    what = "resuming" if resume else "run directory"
    return (
        f"{what}: {cfg.output_dir}  (method {cfg.method.name}{_recipe_note(cfg)}, model {cfg.model.name}, "
        f"data {shown(cfg.data.name)}, {t.steps} steps x {r.prompts_per_step} prompts x {r.group_size}, "
        f"{t.mini_batches * t.epochs} update(s) per rollout, up to {r.max_new_tokens} new tokens, engine {r.engine})"
    )


def _recipe_note(cfg: Config) -> str:
    recipe = cfg.method.recipe
    return ", no recipe" if recipe is False else f", recipe {recipe}" if isinstance(recipe, str) else ""


def _sampler_records(method, cfg: Config) -> dict:
    """What the sampler must record while decoding: with train.old_policy=sampler its distribution stands
    in for pi_old, so a method's top-K proposal and old entropy come from there (thinkrl/learner/old_policy.py)."""
    if cfg.train.old_policy != "sampler":
        return {}
    needs = method.requires
    return {
        "record_topk": method.topk_width if needs & {"topk_ids", "topk_old_logp", "topk_logp"} else 0,
        "record_entropy": "old_entropy" in needs,
    }
