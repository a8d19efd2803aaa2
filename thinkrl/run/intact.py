"""Is a checkpoint intact? Which one does a resume, an eval or an export use?

A complete checkpoint can still be damaged afterwards (a file deleted or cut short by a copy, an edited
trainer_state.json). Before a resume uses one, `verify` checks it: every file present, each .pt a whole torch
archive, each safetensors file whole, trainer_state.json a JSON object whose "step" is the integer N of its
directory step-N. `latest_intact` skips damaged ones newest first, each named in one line, and resumes from
the newest intact one (the damaged newer ones are set aside as checkpoints/damaged-step-N once the run has
set up, so rotation never counts them); with none intact it is a one-line error. A checkpoint whose files
disagree with its step is never used.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.run.atomic import fsync_dir
from thinkrl.run.checkpoint import MARKER, checkpoint_step, complete_checkpoints

REQUIRED = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "method.pt")
OPTIONAL_PT = ("sampler.pt", "seeds.pt")


def verify(ckpt: Path) -> str | None:
    """What is wrong with a complete checkpoint, as '<file> <problem>' naming the file; None when it is intact.
    Cheap: archives and safetensors headers are checked against their size, no tensor is loaded."""
    ckpt = Path(ckpt)
    for name in REQUIRED:
        if not (ckpt / name).is_file():
            return f"{ckpt / name} is missing"
    path = ckpt / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{path} is not readable JSON ({type(e).__name__}: {e})"
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        return f"{path} gives step {step!r}, not an integer"
    if step != checkpoint_step(ckpt):
        return f"{path} gives step {step}, but its directory is {ckpt.name}"
    for name in (*REQUIRED[1:], *OPTIONAL_PT):
        if (ckpt / name).is_file() and (problem := _torch_archive_problem(ckpt / name)):
            return f"{ckpt / name} is damaged ({problem})"
    return _weights_problem(ckpt)


def _torch_archive_problem(path: Path) -> str | None:
    """torch.save writes a zip archive whose directory is at its end: a cut-short file has none."""
    try:
        with zipfile.ZipFile(path) as z:
            z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _weights_problem(ckpt: Path) -> str | None:
    from safetensors import safe_open

    if (ckpt / "adapter").is_dir():
        files = [ckpt / "adapter" / "adapter_model.safetensors"]
    elif (ckpt / "model").is_dir():
        files = sorted((ckpt / "model").glob("*.safetensors")) or [ckpt / "model" / "model.safetensors"]
    else:
        return f"{ckpt / 'adapter'} is missing (no adapter/ or model/ weights)"
    for f in files:
        if not f.is_file():  # e.g. only a pickled .bin, which is never read
            return f"{f} is missing ({ckpt} has no {f.relative_to(ckpt)}; thinkrl reads weights only from safetensors)"
        try:
            with safe_open(str(f), "pt") as h:  # checks the header and that the data covers the whole file
                h.keys()
        except Exception as e:  # SafetensorError (a Rust exception type), OSError
            return f"{f} is damaged ({(str(e).strip().splitlines() or [type(e).__name__])[0]})"
    return None


def latest_intact(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest intact complete checkpoint or None, [(damaged newer checkpoint, what is wrong)]).
    None with damaged ones means none is intact: a one-line UserError naming each."""
    damaged = []
    for ckpt in reversed(complete_checkpoints(run_dir)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt, damaged
        damaged.append((ckpt, problem))
    if damaged:
        raise UserError(
            f"no intact checkpoint in {Path(run_dir) / 'checkpoints'}: " + "; ".join(p for _, p in damaged) + ". "
            f"Restore the damaged files, or move {Path(run_dir) / 'checkpoints'} away to train {run_dir} again from step 0"
        )
    return None, []


def set_aside(damaged: list[Path]) -> list[Path]:
    """Rename damaged checkpoints to checkpoints/damaged-step-N (never read, never rotated); returns the new paths."""
    moved = []
    for ckpt in damaged:
        target = ckpt.parent / f"damaged-{ckpt.name}"
        n = 1
        while target.exists():
            n += 1
            target = ckpt.parent / f"damaged-{ckpt.name}.{n}"
        os.replace(ckpt, target)
        moved.append(target)
    if moved:
        fsync_dir(moved[0].parent)
    return moved


def find_checkpoint(model_arg: str) -> tuple[Path, Path] | None:
    """(run_dir, checkpoint) when `model_arg` is a run directory or one of its checkpoints."""
    p = Path(model_arg)
    if (p / "config.yaml").is_file():
        ckpt, damaged = latest_intact(p)
        if ckpt is None:
            raise UserError(f"run directory {p} has no complete checkpoint yet")
        if damaged:
            from rich.markup import escape

            from thinkrl.run.console import console

            for _, problem in damaged:
                console.print(f"[yellow]note: {escape(problem)}: that checkpoint is damaged; using {ckpt.name}[/]", soft_wrap=True)
        return p, ckpt
    if (p / MARKER).is_file() and p.parent.name == "checkpoints":
        if (problem := verify(p)) is not None:
            raise UserError(f"checkpoint {p} is damaged: {problem}; use another checkpoint of {p.parent}")
        return p.parent.parent, p
    return None
