"""Atomic small files: config.yaml, data_report.json, changes.jsonl, a checkpoint's trainer_state.json and
COMPLETE marker, eval's settings.json and summary.json.

    write_atomic(path, text)

The bytes go to a temporary file in the same directory (`.NAME.tmp-PID`), are flushed and fsynced, and the
temporary file is renamed over `path` (os.replace, atomic on POSIX); then the directory entry is fsynced.
So a reader, a killed process or a full disk sees either the old file whole or the new one whole, never an
empty or half-written one. A failed write removes its temporary file and re-raises the OSError (callers
turn it into one line with thinkrl.run.faults.writes). A temporary file of the same target left by a process
that no longer exists (killed mid-write) is removed by the next write.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _write(fd: int, data: bytes) -> None:
    """Every byte of `data` to fd (os.write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _sweep(path: Path) -> None:
    """Remove `path`'s temporary files whose writer is dead (a kill between open and rename leaves one)."""
    for old in path.parent.glob(f".{path.name}.tmp-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                old.unlink()


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` (str: UTF-8) atomically; the old file is intact if anything fails."""
    path = Path(path)
    _sweep(path)
    tmp = temporary_name(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Put a directory's entries (a rename) on disk; best effort: some file systems cannot fsync a directory."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
