"""Atomic checkpoints: RUN_DIR/checkpoints/step-N/, written and loaded (thinkrl/run/intact.py checks them first).

A checkpoint is written into a hidden temporary directory, a COMPLETE marker is written last, and the
directory is renamed into place; old checkpoints are renamed to a hidden name before they are deleted. So a
process killed at any point (SIGKILL, OOM killer, power cut) leaves every step-N/ either complete or absent,
plus hidden leftovers that latest() ignores and the next save() deletes. Only tensors and numbers are ever
unpickled (weights_only=True) and weights are read only from safetensors. Contents:
    adapter/            peft adapter (LoRA), or model/ (full fine-tuning, safetensors)
    optimizer.pt        optimizer state      (tensors and numbers only: loaded with weights_only=True)
    scheduler.pt        LR scheduler state
    method.pt           the method's persistent state (controllers, EMAs)
    sampler.pt          the sampler's snapshots of recent policies (only with rollout.staleness > 0)
    seeds.pt, seeds/    the Thinking Seeds pool (adapters inline; full weights as hard links to RUN_DIR/seeds/)
    trainer_state.json  step and seed; the data position and RNG are functions of (seed, step)
    COMPLETE
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import torch

from thinkrl.errors import UserError
from thinkrl.run.atomic import pid_alive, write_atomic

MARKER = "COMPLETE"
# Hidden directories next to the checkpoints, named after the process that made them: `.tmp-step-N-PID` is
# a checkpoint being written, `.old-step-N-PID` one being deleted. A process killed at any point leaves at
# most these behind; latest() never looks at them and remove_stale() deletes those of dead processes.
HIDDEN = re.compile(r"\.(tmp|old)-step-\d+-(\d+)")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    # ours from an earlier call (or a dead run whose pid we reuse): nothing is writing it
    return pid != os.getpid() and pid_alive(pid)


def remove_stale(run_dir: Path) -> list[Path]:
    """Delete the hidden directories that killed processes left in RUN_DIR/checkpoints; returns them.
    A directory whose process is still alive is left alone: another trainer may be writing it."""
    root = Path(run_dir) / "checkpoints"
    stale = [p for p in root.iterdir() if (m := HIDDEN.fullmatch(p.name)) and not _alive(int(m.group(2)))] if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def _discard(path: Path) -> None:
    """Delete a checkpoint directory. It is renamed to a hidden name first (atomic), so a kill during the
    slow recursive delete never leaves a half-deleted step-N that still holds its COMPLETE marker."""
    trash = path.parent / f".old-{path.name}-{os.getpid()}"
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_weights(model, tokenizer, directory: Path, state_dict: dict | None = None) -> None:
    """Adapter only (peft) or the whole model, in safetensors; `state_dict`: the weights to write in place of
    the model's own (whole tensors gathered from FSDP shards, thinkrl/sharding.py)."""
    given = {} if state_dict is None else {"state_dict": state_dict}
    if is_peft(model):
        model.save_pretrained(directory / "adapter", **given)
    else:
        model.save_pretrained(directory / "model", **given)
        tokenizer.save_pretrained(directory / "model")


def save(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    scheduler,
    method,
    extra: dict,
    keep_last: int = 0,
    sampler=None,
    seed_pool=None,
    gathered: tuple[dict, dict] | None = None,
) -> Path:
    """Write checkpoint step-`step` atomically; `gathered`: (weights, optimizer state) to write instead of the
    model's and optimizer's own (FSDP: thinkrl/sharding.py gathered them from every rank)."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    remove_stale(run_dir)  # what an earlier, killed process left (this one's own leftovers included)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    tmp.mkdir()
    weights, optimizer_state = gathered if gathered is not None else (None, optimizer.state_dict())
    save_weights(model, tokenizer, tmp, weights)
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(method.state_dict(), tmp / "method.pt")
    if sampler is not None and sampler.staleness:
        torch.save(sampler.state_dict(), tmp / "sampler.pt")
    if seed_pool is not None:
        seed_pool.save(tmp)
    write_atomic(tmp / "trainer_state.json", json.dumps({"step": step, **extra}, indent=2))
    write_atomic(tmp / MARKER, "ok\n")
    # a SIGKILL loses nothing the kernel already has, but a power cut can: every file and directory entry
    # must be on disk before the rename makes the checkpoint visible
    for f in sorted(tmp.rglob("*"), reverse=True):
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        elif f.is_dir():
            _fsync_dir(f)
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. a step-N left without its marker): replace it
        _discard(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep_last > 0:
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            _discard(old)
    return final


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if re.fullmatch(r"step-\d+", p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest(run_dir: Path) -> Path | None:
    ckpts = complete_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def _load_pt(path: Path):
    """A checkpoint's .pt file, unpickled with weights_only=True: tensors, numbers and plain containers
    only, so a planted file cannot run code. Anything else is refused with the file's name."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is a page long and suggests allowlisting the global; keep the sentence naming it
        line = next((line for line in str(e).splitlines() if "unsupported" in line.lower()), "")
        reason = (
            line.split(". ")[0].strip().removesuffix(".").removeprefix("WeightsUnpickler error: ")
            or "refused by the weights-only unpickler"
        )
        raise UserError(
            f"{path} holds objects other than tensors and numbers ({reason}); thinkrl loads checkpoints with "
            "weights_only=True and will not unpickle it. Was it written by thinkrl?"
        ) from None
    except (RuntimeError, EOFError, IndexError, ValueError) as e:  # what torch raises for a damaged file
        raise UserError(
            f"{path} could not be read ({type(e).__name__}: {e}); if it is damaged, delete {path.parent} "
            "to resume from the checkpoint before it"
        ) from None


def load_weights_into(model, directory: Path) -> None:
    """Load a checkpoint's weights into an already built model of the same shape (safetensors only: a
    pickled .bin is never read)."""
    if is_peft(model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = directory / "adapter" / "adapter_model.safetensors"
        if not path.is_file():
            raise UserError(f"{directory} has no adapter/adapter_model.safetensors; thinkrl reads adapters only in safetensors")
        state = load_file(str(path), device=str(next(model.parameters()).device))
        result = set_peft_model_state_dict(model, state)
        if getattr(result, "unexpected_keys", None):
            raise RuntimeError(f"adapter in {directory} does not match the model: {result.unexpected_keys[:3]}")
    else:
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(directory / "model", dtype=next(model.parameters()).dtype, use_safetensors=True)
        model.load_state_dict(saved.state_dict())


def load_weights(ckpt: Path, model) -> None:
    """A checkpoint's weights into the built model (before Accelerate wraps or shards it)."""
    with _fits(ckpt):
        load_weights_into(model, ckpt)


def load_state(
    ckpt: Path, optimizer, scheduler, method, sampler=None, seed_pool=None, load_optimizer=None, read_optimizer: bool = True
) -> dict:
    """Restore everything else a checkpoint holds (`verify` it first); returns its trainer_state.
    `load_optimizer` puts the optimizer state in place where optimizer.load_state_dict cannot (FSDP shards);
    without `read_optimizer` it is handed {} (FSDP: rank 0 alone reads optimizer.pt and broadcasts it)."""
    with _fits(ckpt):
        state = _load_pt(ckpt / "optimizer.pt") if read_optimizer else {}
        (load_optimizer or optimizer.load_state_dict)(state)
        scheduler.load_state_dict(_load_pt(ckpt / "scheduler.pt"))
        method.load_state_dict(_load_pt(ckpt / "method.pt"))
        if sampler is not None and (ckpt / "sampler.pt").is_file():
            sampler.load_state_dict(_load_pt(ckpt / "sampler.pt"))
        if seed_pool is not None:
            seed_pool.load(ckpt, sampler.model.device if sampler is not None else "cpu")
    return json.loads((ckpt / "trainer_state.json").read_text())


@contextlib.contextmanager
def _fits(ckpt: Path):
    """A checkpoint that does not fit this run (another model, LoRA shape or method: a resume with
    --allow-changes) is one line."""
    try:
        yield
    except (RuntimeError, ValueError, KeyError) as e:
        if "out of memory" in str(e).lower():
            raise
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        detail = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]  # torch: "Error(s) in loading ...:" then the first
        raise UserError(
            f"{ckpt} does not fit this run ({type(e).__name__}: {detail}); the model, model.lora.* or the method differ from "
            "the ones it was trained with: resume with the run's own settings (its config.yaml) or start a new run"
        ) from None


def checkpoint_step(ckpt: Path) -> int:
    """The training step a checkpoint holds (its directory name step-N)."""
    return int(Path(ckpt).name.split("-")[1])
