"""An evaluation's failed write as one line: which file, why, and the fix (another --output, free space, or
for an evaluation during training, the trainer's resume command)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.run import faults


def check_output(out_dir: Path) -> None:
    """Before the model loads: out_dir can be made and written (no file where a directory goes, not read-only)."""
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"cannot write {out_dir}: {existing} is a file, not a directory; choose another --output (or move that file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {out_dir}: {existing} is not writable (read-only); make it writable or choose another --output")


@contextlib.contextmanager
def writing(path: Path, out_dir: Path, run_dir: Path | None):
    """A failed write of `path` becomes one line naming it, the reason and the fix. run_dir: evaluation during
    training, whose fix is the trainer's (free space, then thinkrl train --resume)."""
    try:
        yield
    except OSError as e:
        named = Path(e.filename) if isinstance(e.filename, (str, Path)) else None
        where = named if named is not None and named.parent != path.parent else path  # not a temporary sibling's name
        raise UserError(faults.cannot_write(e, where, run_dir, True) if run_dir else cannot_write(e, where, out_dir)) from e


def cannot_write(e: OSError, path: Path, out_dir: Path) -> str:
    reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        return f"cannot write {path} ({reason}): {file} is a file, not a directory; choose another --output (or move that file)"
    fix = "make it writable" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "free space on that disk"
    kept = (
        "; the samples already in samples.jsonl are kept and the same command continues from them"
        if (out_dir / "samples.jsonl").is_file()
        else ""
    )
    return f"cannot write {path} ({reason}{faults.free_space(path)}); {fix} or choose another --output{kept}"
