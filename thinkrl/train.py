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

Resume (thinkrl/run/resume.py): a change to what makes the run (model, LoRA shape, method, data, prompts,
group size, prompts per step, seeds) is refused unless allow_changes, and recorded in RUN_DIR/changes.jsonl;
config.yaml is rewritten only once the resumed run has set up. A damaged newest checkpoint is named in one line
and the newest intact one is used (thinkrl/run/intact.py). A new run refuses an --output-dir holding a
run or other files.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.markup import escape

from thinkrl import accel, distributed, setup
from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.evaluation.evaluate import eval_during_training
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.update import update
from thinkrl.models import eos_ids
from thinkrl.rollout.collect import RolloutContext, collect
from thinkrl.run import checkpoint, faults, intact, lock, records, trackers
from thinkrl.run import resume as resuming
from thinkrl.run.console import console, progress, shown, step_line
from thinkrl.run.jsonl import JsonlLog
from thinkrl.settings import on_policy_note, resolve_with_method
from thinkrl.verifier import load_grader


def train(cfg: Config, resume: bool = False, allow_changes: bool = False) -> Path:
    accel.process_start()  # on a CPU: allocator settings and the freed-block cache (thinkrl/accel)
    with contextlib.ExitStack() as held:  # the run directory's lock (thinkrl/run/lock.py), released however the run ends
        return _train(cfg, resume, held, allow_changes)


def _train(cfg: Config, resume: bool, held: contextlib.ExitStack, allow_changes: bool = False) -> Path:
    from accelerate import Accelerator

    cfg, method = resolve_with_method(cfg)  # the method is built here, once
    # several processes (torchrun / accelerate launch): Accelerate sets up the process group and wraps the
    # model; thinkrl/distributed.py says which prompts are this rank's; only rank 0 writes
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), **trackers.accelerator_kwargs(cfg.log, Path(cfg.output_dir)))
    cfg.output_dir = distributed.all_gather(cfg.output_dir)[0]  # a default name is made per process: every rank takes rank 0's
    run_dir = Path(cfg.output_dir)
    rank, world = distributed.world()
    main = rank == 0
    console.quiet = not main
    console.print(run_summary(cfg, resume), soft_wrap=True)
    note = on_policy_note(cfg)
    if note:
        console.print(f"[yellow]{note}[/]", soft_wrap=True)
    if cfg.rollout.prompts_per_step % world:
        raise UserError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be a multiple of the {world} processes "
            "(each takes whole groups); change it or the process count"
        )
    locked = main and run_dir.is_dir()  # rank 0 locks a directory that exists before reading its checkpoint,
    if locked:  # and a new one as soon as setup has worked and created it (setup.open_run_dir)
        with faults.writes(run_dir / lock.NAME, run_dir, started=False):
            held.enter_context(lock.DirLock(run_dir, "training run"))
    ckpt, damaged = intact.latest_intact(run_dir) if resume else (None, [])
    if resume:  # what makes the run may not change (thinkrl/run/resume.py)
        resuming.check(run_dir, cfg, allow_changes, checkpoint.checkpoint_step(ckpt) if ckpt else 0)
    for bad, problem in damaged:  # never used: set aside as checkpoints/damaged-step-N once setup has worked
        console.print(f"[yellow]note: {escape(problem)}: {bad.name} is damaged, so the run resumes from {ckpt.name}[/]", soft_wrap=True)
    if resume and ckpt is None:
        console.print(f"no complete checkpoint in {run_dir}: starting from step 0")
    if not resume:
        resuming.check_new_run_dir(run_dir)  # an existing run (use --resume) or the user's own files
    setup.check_writable(run_dir)
    grade_fn = load_grader(cfg.verifier.grader)  # a bad grader fails here, before config.yaml is written

    # --- setup: data, model, method, optimizer, sampler, engine; the run directory appears once they work
    s = setup.prepare(cfg, method, accelerator, run_dir, ckpt)
    policy, tok, learner, sampler, engine, seed_pool = s.policy, s.tok, s.learner, s.sampler, s.engine, s.seed_pool
    accelerator.wait_for_everyone()  # every rank has set up before rank 0 writes anything
    setup.open_run_dir(cfg, run_dir, s.data_report, main, held if main and not locked else None, s.start if resume else None)
    if main and damaged:
        with faults.writes(run_dir / "checkpoints", run_dir):
            for moved in intact.set_aside([bad for bad, _ in damaged]):
                console.print(f"set the damaged checkpoint aside as {escape(str(moved))}; delete it when done with it", soft_wrap=True)
    trackers.start(accelerator, cfg)
    tc, rc, device, start = cfg.train, cfg.rollout, accelerator.device, s.start
    estimator = method.advantage if cfg.advantage.estimator == "auto" else cfg.advantage.estimator
    metrics_log, rollouts_log = JsonlLog(run_dir / "metrics.jsonl"), JsonlLog(run_dir / "rollouts.jsonl")
    if main:
        metrics_log.truncate_after(start)
        rollouts_log.truncate_after(start)

    def save(step: int) -> None:
        state = {"seed": tc.seed, "method": cfg.method.name}
        if not main:
            return
        try:
            with faults.writes(run_dir / "checkpoints" / f"step-{step}", run_dir):
                checkpoint.save(
                    run_dir, step, policy, tok, learner.optimizer, learner.scheduler, method, state, tc.keep_last, sampler, seed_pool
                )
        except UserError:
            with contextlib.suppress(OSError):  # the half-written temporary directory: give its space back now
                checkpoint.remove_stale(run_dir)
            raise

    flag = faults.StopFlag()
    step, phase, nonfinite = start, "setup", 0  # nonfinite: steps in a row whose every update was skipped
    try:
        with (
            faults.ShieldedPool(cfg.verifier.workers, cfg.verifier.timeout, grade_fn=grade_fn) as pool,
            progress() as bar,
        ):
            task = bar.add_task(cfg.method.name, total=tc.steps, completed=start, info="")
            eos, recorded = eos_ids(policy, tok), _sampler_records(method, cfg)
            rollout = RolloutContext(
                cfg, engine, sampler, tok, pool, eos, tok.pad_token_id, **recorded, seed_pool=seed_pool, rewards=s.rewards
            )
            prompts = s.prompts
            for step in range(start, tc.steps):
                t0 = time.perf_counter()
                generator = setup.reseed(tc.seed, step + 1, device, rank)

                # 1-2. rollout and score: G completions per prompt with behaviour log-probs, rewards (B,)
                phase = "generation"
                sampler.refresh()
                if seed_pool is not None:  # Thinking Seeds: every seeds.every steps the policy joins the pool
                    seed_pool.maybe_add(step, sampler.snapshot())
                samples = collect(rollout, step, prompts, generator)
                t2 = time.perf_counter()

                # 3. advantages (B,) and 4. update (skipped when dynamic sampling kept no group)
                phase = "update"
                upd, adv, astats = {}, torch.zeros(0), {}
                if samples.prompts:
                    adv, astats = compute_advantages(samples.rewards, rc.group_size, estimator, cfg.advantage.eps)
                if distributed.all_sum([float(not samples.prompts)])[0] == 0:  # every rank kept a group: all update
                    comp = samples.comp
                    if rc.mask_truncated:  # DAPO's overlong filtering: truncated completions teach nothing
                        comp = replace(comp, mask=comp.mask & ~comp.truncated[:, None])
                    rb = RolloutBatch([p.ids for p in samples.prompts for _ in range(rc.group_size)], comp, adv.to(device), rc.group_size)
                    upd = update(learner, rb, generator)
                nonfinite = faults.nonfinite_streak(nonfinite, upd)
                t3 = time.perf_counter()

                # 5. evaluate (eval.every), log, checkpoint
                done = step + 1 == tc.steps
                evals = {}
                if main and cfg.eval.every and ((step + 1) % cfg.eval.every == 0 or done):
                    phase = "evaluation"
                    evals = eval_during_training(sampler.refresh(current=True), tok, cfg, run_dir, step + 1, pool, engine)
                    evals["time/eval"] = time.perf_counter() - t3
                record = records.step_record(step + 1, samples, upd, astats, {"time/update": t3 - t2, "time/step": t3 - t0, **evals})
                if main:
                    with faults.writes(metrics_log.path, run_dir):
                        metrics_log.write(record)
                    accelerator.log(trackers.loggable(record), step=step + 1)
                if cfg.log.rollouts_every and (step + 1) % cfg.log.rollouts_every == 0:
                    lines = records.rollout_records(step + 1, samples, adv, rc.group_size)
                    if main:
                        with faults.writes(rollouts_log.path, run_dir):
                            rollouts_log.write(lines)
                bar.console.print(step_line(record, tc.steps), soft_wrap=True)
                bar.update(task, advance=1, info=f"reward {record['reward/mean']:.3f}")
                diverged = 0 < tc.max_nonfinite_steps <= nonfinite
                stop = distributed.all_max(float(flag.stop)) > 0  # a signal seen by any rank stops them all
                if done or (tc.save_every and (step + 1) % tc.save_every == 0) or stop or diverged:
                    save(step + 1)
                    accelerator.wait_for_everyone()
                if diverged:  # the checkpoint holds the last good weights: skipped updates changed nothing
                    dtype = str(next(policy.parameters()).dtype).removeprefix("torch.")
                    raise UserError(faults.nonfinite_message(cfg, step + 1, nonfinite, run_dir, dtype))
                if stop and not done:
                    # soft_wrap: never wrapped at the console width, so the command stays one copyable line in a log file
                    console.print(f"stopped after step {step + 1}; continue with: thinkrl train --resume {run_dir}", soft_wrap=True)
                    break
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError, as are older torch's OOM errors
        if not faults.is_out_of_memory(e):
            raise
        raise UserError(faults.out_of_memory_message(cfg, step + 1, phase, run_dir)) from e
    finally:
        flag.restore()
        engine.close()
        accelerator.end_training()  # flush and close the trackers
        distributed.shutdown()
    console.print(f"run directory: {run_dir}")
    return run_dir


def run_summary(cfg: Config, resume: bool) -> str:
    """The first line a run prints: where it writes and what it trains."""
    r, t = cfg.rollout, cfg.train
    what = "resuming" if resume else "run directory"
    return (
        f"{what}: {cfg.output_dir}  (method {cfg.method.name}{'' if cfg.method.recipe else ', no recipe'}, model {cfg.model.name}, "
        f"data {shown(cfg.data.name)}, {t.steps} steps x {r.prompts_per_step} prompts x {r.group_size}, "
        f"{t.mini_batches * t.epochs} update(s) per rollout, up to {r.max_new_tokens} new tokens, engine {r.engine})"
    )


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
