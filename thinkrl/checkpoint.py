"""Atomic checkpoints: RUN_DIR/checkpoints/step-N/ and resuming from the newest complete one.

A checkpoint is written into a hidden temporary directory, a COMPLETE marker is written last, and the
directory is renamed into place; a process killed mid-write leaves only a temporary directory, which is
ignored. Contents:
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

import json
import os
import re
import shutil
from pathlib import Path

import torch

MARKER = "COMPLETE"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_weights(model, tokenizer, directory: Path) -> None:
    """Adapter only (peft) or the whole model, in safetensors."""
    if is_peft(model):
        model.save_pretrained(directory / "adapter")
    else:
        model.save_pretrained(directory / "model")
        tokenizer.save_pretrained(directory / "model")


def save(run_dir: Path, step: int, model, tokenizer, optimizer, scheduler, method, extra: dict, keep_last: int = 0, sampler=None, seed_pool=None) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_weights(model, tokenizer, tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(method.state_dict(), tmp / "method.pt")
    if sampler is not None and sampler.staleness:
        torch.save(sampler.state_dict(), tmp / "sampler.pt")
    if seed_pool is not None:
        seed_pool.save(tmp)
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **extra}, indent=2))
    (tmp / MARKER).write_text("ok\n")
    for f in tmp.rglob("*"):
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep_last > 0:
        for old in complete_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
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


def load_weights_into(model, directory: Path) -> None:
    """Load a checkpoint's weights into an already built model of the same shape."""
    if is_peft(model):
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        state = load_file(str(directory / "adapter" / "adapter_model.safetensors"), device=str(next(model.parameters()).device))
        result = set_peft_model_state_dict(model, state)
        if getattr(result, "unexpected_keys", None):
            raise RuntimeError(f"adapter in {directory} does not match the model: {result.unexpected_keys[:3]}")
    else:
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(directory / "model", dtype=next(model.parameters()).dtype)
        model.load_state_dict(saved.state_dict())


def load(ckpt: Path, model, optimizer, scheduler, method, sampler=None, seed_pool=None) -> dict:
    """Restore everything a checkpoint holds; returns its trainer_state."""
    load_weights_into(model, ckpt)
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=True))
    method.load_state_dict(torch.load(ckpt / "method.pt", weights_only=True))
    if sampler is not None and (ckpt / "sampler.pt").is_file():
        sampler.load_state_dict(torch.load(ckpt / "sampler.pt", weights_only=True))
    if seed_pool is not None:
        seed_pool.load(ckpt, next(model.parameters()).device)
    return json.loads((ckpt / "trainer_state.json").read_text())
