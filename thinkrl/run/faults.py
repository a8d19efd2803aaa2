"""What the training loop does when something goes wrong: signals, non-finite updates, full disks, OOM.

Every path ends in one of two ways: the step finishes and a checkpoint is written (Ctrl-C, SIGTERM), or the
run stops with a one-line UserError that names the step, the cause and the fix, with the previous complete
checkpoint intact (non-finite updates after train.max_nonfinite_steps, write failures, out of memory).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import signal
from pathlib import Path

import torch
from safetensors import SafetensorError

from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.run import checkpoint
from thinkrl.run.console import console
from thinkrl.run.resume import makes_the_run, resume_command
from thinkrl.verifier.shielded import STOP_SIGNALS


class StopFlag:
    """First SIGINT/SIGTERM: finish the current step, checkpoint, exit. A second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.stop = False
        self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop = True
        console.print("[yellow]stopping after this step (checkpoint first); press Ctrl-C again to abort now[/]")

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def nonfinite_streak(streak: int, upd: dict) -> int:
    """Steps in a row whose every update was skipped as NaN/inf. A step that had nothing to train on
    (dynamic sampling kept no group, every token masked) neither extends nor ends the streak."""
    applied, skipped = upd.get("update/optimizer_steps", 0), upd.get("update/skipped_nonfinite", 0)
    if not applied and not skipped:
        return streak
    return streak + 1 if not applied else 0


def nonfinite_message(cfg: Config, step: int, streak: int, run_dir: Path, dtype: str) -> str:
    """The stop message: the likely causes that apply to this run, each with its setting and fix."""
    tc, lower = cfg.train, f"{cfg.train.lr / 10:g}"
    causes = [
        f"a learning rate too high (train.lr={tc.lr:g}: lower it, e.g. -o train.lr={lower})",
        *(["no gradient clipping (train.grad_clip=0: set it to 1.0)"] if tc.grad_clip <= 0 else []),
        *([f"{dtype} overflow (the trainer runs in {dtype}: -o model.dtype=float32)"] if dtype != "float32" else []),
        f"a NaN reward or advantage (verifier.grader={cfg.verifier.grader}, advantage.estimator={cfg.advantage.estimator})",
    ]
    return (
        f"step {step}: the loss or gradient was NaN/inf in every update of the last {streak} steps "
        f"(train.max_nonfinite_steps={tc.max_nonfinite_steps}), so those updates were skipped and training stopped; "
        f"checkpoint step-{step} holds the last good weights. Likely causes: {'; '.join(causes)}. "
        f"Continue with: {resume_command(run_dir, '-o', f'train.lr={lower}')}"
    )


def is_out_of_memory(e: BaseException) -> bool:
    """Only torch's own out-of-memory error (CUDA and ROCm; MPS from torch 2.5 on, before which its allocator raised
    a RuntimeError of its own wording): a RuntimeError that merely says "out of memory" (a plugin's, a library's)
    is not reported as one, since the memory settings would not fix it."""
    if not hasattr(torch, "OutOfMemoryError"):  # torch 2.4
        return isinstance(e, torch.cuda.OutOfMemoryError) or str(e).startswith("MPS backend out of memory")
    return isinstance(e, torch.OutOfMemoryError)  # torch.cuda.OutOfMemoryError is this class


def out_of_memory_message(cfg: Config, step: int, phase: str, run_dir: Path) -> str:
    """Name every setting that lowers peak memory, with its value now, and a resume command for the phase."""
    r, t = cfg.rollout, cfg.train
    ckpt = checkpoint.latest(run_dir)
    kept = f"nothing new was saved, {ckpt.name} is the last checkpoint" if ckpt else "nothing was saved"
    knobs = (
        f"train.micro_batch_size={t.micro_batch_size} and train.micro_batch_tokens={t.micro_batch_tokens} (update), "
        f"train.gradient_checkpointing={str(t.gradient_checkpointing).lower()} (update; true keeps far fewer activations), "
        f"rollout.batch_size={r.batch_size} (generation), "
        f"rollout.max_new_tokens={r.max_new_tokens}, rollout.prompts_per_step={r.prompts_per_step} x "
        f"rollout.group_size={r.group_size} completions per step, model.lora.rank={cfg.model.lora.rank} (a new run only)"
    )
    first = {  # the smaller setting to resume with, by where memory ran out
        "update": [
            ("train.micro_batch_tokens", t.micro_batch_tokens),
            ("train.micro_batch_size", t.micro_batch_size),
            ("rollout.max_new_tokens", r.max_new_tokens),
        ],
        "evaluation": [("eval.max_new_tokens", cfg.eval.max_new_tokens or r.max_new_tokens)],
    }.get(phase, [("rollout.batch_size", r.batch_size), ("rollout.max_new_tokens", r.max_new_tokens)])
    key, value = next(((k, v) for k, v in first if v > 1), first[-1])
    # a shorter rollout.max_new_tokens changes what is sampled: a resume takes it only with --allow-changes
    smaller = ["-o", f"{key}={max(1, value // 2)}", *(["--allow-changes"] if makes_the_run(key) else [])]
    return (
        f"step {step}: out of GPU memory during the {phase}; {kept}. Settings that lower memory (now): {knobs}. "
        f"Continue with a smaller one: {resume_command(run_dir, *smaller)}"
    )


# errno of a write refused for permission, or of a path that is not a directory, rather than for room;
# torch.save and safetensors report a failed write as RuntimeError / SafetensorError without any errno,
# so the message always shows the free space too
_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}
_NOT_A_DIRECTORY = {errno.ENOTDIR, errno.EEXIST}


@contextlib.contextmanager
def writes(path: Path, run_dir: Path, started: bool = True):
    """A failed write under run_dir becomes one line naming `path`, the reason and the fix. Wrap only code
    that writes: a RuntimeError here is a failed write, not a bug elsewhere."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:
        raise UserError(cannot_write(e, path, run_dir, started)) from e


def cannot_write(e: BaseException, path: Path, run_dir: Path, started: bool) -> str:
    reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    room = free_space(path)
    code = getattr(e, "errno", None)
    refused = code in _NOT_WRITABLE
    if not started:
        fix = "make it writable or " if refused else "" if code in _NOT_A_DIRECTORY else "free space on that disk or "
        return f"cannot write {path} ({reason}{room}); {fix}choose another --output-dir"
    ckpt = checkpoint.latest(run_dir)
    kept = f"the last complete checkpoint {ckpt} is intact" if ckpt else "no checkpoint was written yet"
    fix = f"Make {run_dir} writable again" if refused else f"Free space on that disk (or move {run_dir} to a disk with room)"
    return (
        f"cannot write {path} ({reason}{room}); {kept} and metrics.jsonl keeps the steps logged so far. "
        f"{fix}, then continue with: {resume_command(run_dir)}"
    )


def free_space(path: Path) -> str:
    try:
        where = next(p for p in (path, *path.parents) if p.exists())
        return f"; {shutil.disk_usage(where).free / 2**30:.1f} GiB free there"
    except (OSError, StopIteration):
        return ""
