"""One process per run directory (and per eval output directory): DIR/.lock.

    with DirLock(run_dir, "training run"):      # a second process on DIR fails in one line naming this one

The holder keeps an exclusive flock on DIR/.lock, so the kernel decides and drops the lock however the holder
dies; the JSON in the file ({pid, host, started, command}) only feeds the message. How staleness, unlinking,
forked children and file systems without flock are handled: docs/runs.md ("One process per directory").
In a multi-process run only rank 0 takes the lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.run.atomic import pid_alive
from thinkrl.run.console import console

NAME = ".lock"
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class DirLock:
    """Exclusive use of directory `path` (created if missing) while the `with` block runs.

    `what` names the work in the message ("training run", "evaluation"); `elsewhere` says where else the
    user could write instead (e.g. "another --output-dir")."""

    def __init__(self, path: Path | str, what: str, elsewhere: str = "another --output-dir") -> None:
        self.dir, self.what, self.elsewhere = Path(path), what, elsewhere
        self.path = self.dir / NAME
        self._fd: int | None = None

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this DirLock")
        self.dir.mkdir(parents=True, exist_ok=True)
        for _ in range(100):  # another try only when the holder released (unlinked) the file we opened meanwhile
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if not self._lock(fd):
                    continue
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            break
        else:
            raise UserError(f"{self.path} keeps being replaced by other processes; check what else uses {self.dir}")
        previous = _read(self._fd)
        _write(self._fd, record())
        if previous:
            console.print(
                f"[yellow]note: took over {self.path} ({_describe(previous)}), which ended without releasing it[/]", soft_wrap=True
            )

    def _lock(self, fd: int) -> bool:
        """True when `fd` now holds the lock; False when the file was replaced meanwhile (try again)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(self._held_message(_read(fd, wait=True))) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise
            holder = _read(fd)  # no flock here: the record decides (see the module docstring)
            if holder and _holder_alive(holder):
                raise UserError(self._held_message(holder, flock=False)) from None
            return True
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
        return same

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):  # never remove a file someone else made
                os.unlink(self.path)
        except OSError:  # gone already, or cannot be removed: a file nobody holds is stale, taken over next time
            pass
        finally:
            os.close(fd)  # unlinked first, then unlocked: see the module docstring

    def _held_message(self, holder: dict, flock: bool = True) -> str:
        """One line: who holds the directory and what to do."""
        pid, host = holder.get("pid"), holder.get("host")
        if not isinstance(pid, int):
            fix = f"wait for it to finish or stop it (`fuser -v {self.path}` names it)"
        elif host != socket.gethostname():
            gone = "" if flock else f"; if it no longer runs, delete {self.path}"
            fix = f"wait for it to finish or stop it (kill {pid} on {host}){gone}"
        elif flock and not pid_alive(pid):
            fix = f"PID {pid} has exited, but a process it started still holds the lock: stop that one (`fuser -v {self.path}` names it)"
        else:
            fix = f"wait for it to finish or stop it (kill {pid})"
        return f"{self.dir} is in use by another {self.what} ({_describe(holder)}); {fix}, or use {self.elsewhere}"


def in_use(directory: Path) -> bool:
    """True while another process holds DIR/.lock (a study waits for a run a killed study left stopping)."""
    try:
        fd = os.open(Path(directory) / NAME, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except OSError:  # no flock on this file system: the run's own start decides
        return False
    finally:
        os.close(fd)


def record() -> dict:
    """What this process writes into the lock file: who holds it, for the other process's message."""
    argv = list(sys.argv) or ["python"]
    prog = "thinkrl" if argv[0].endswith(("thinkrl", "__main__.py")) else Path(argv[0]).name
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join([prog, *argv[1:]]),
    }


def _describe(holder: dict) -> str:
    if not isinstance(holder.get("pid"), int):
        return "PID not recorded"
    command = str(holder.get("command", ""))
    command = command if len(command) <= 100 else command[:97] + "..."
    return f"PID {holder['pid']} on {holder.get('host', '?')}, started {holder.get('started', '?')}: {command}"


def _read(fd: int, wait: bool = False) -> dict:
    """The record in the lock file; {} when it is empty or not JSON. wait: give a holder that has just
    created the file a moment to write it."""
    for attempt in range(10 if wait else 1):
        if attempt:
            time.sleep(0.05)
        try:
            data = json.loads(os.pread(fd, 65536, 0) or b"null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            return data
    return {}


def _write(fd: int, holder: dict) -> None:
    """In place (the lock lives on this very file, so no temporary file and rename)."""
    data = json.dumps(holder).encode() + b"\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _holder_alive(holder: dict) -> bool:
    """Without flock: a recorded holder on another host cannot be checked, so it counts as alive."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    return pid != os.getpid() and pid_alive(pid)
