"""Run the thinkrl CLI so that it SIGKILLs itself at a chosen point, for the kill and soak tests.

    THINKRL_KILL=KIND:N THINKRL_KILL_ROOT=RUN_DIR python tests/killpoints.py train ...

The process kills itself (SIGKILL: no handler, no cleanup, no flush) at the N-th call of hook KIND, after
printing `killpoint KIND N` to stderr. Without THINKRL_KILL it is plain `thinkrl`. The file hooks only
count files under THINKRL_KILL_ROOT, so library writes elsewhere (caches, temp files) do not shift N.

`run()` starts it in its own session and optionally kills it from outside after a delay, for kill points
nobody chose.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# hook -> what happens at its N-th call
KINDS = {
    "generate": "after a rollout's generation, before grading",
    "grade": "while the verifier workers hold samples",
    "update": "after the optimizer step, before the step is logged",
    "log": "halfway through a metrics/rollouts line (a torn last line)",
    "save_weights": "after a checkpoint's adapter is written, before its optimizer state",
    "torch.save": "halfway through writing one of a checkpoint's .pt files",
    "replace-before": "just before an os.replace under the run directory (checkpoint commit, log truncation)",
    "replace-after": "just after such an os.replace",
    "rmtree": "halfway through deleting a directory under the run directory (rotation, cleanup)",
}


def _die(kind: str, n: int) -> None:
    sys.stderr.write(f"killpoint {kind} {n}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install(spec: str, root: str) -> None:
    """Wrap the hook named by spec ('KIND:N') so that its N-th call kills the process."""
    kind, _, n = spec.partition(":")
    if kind not in KINDS:
        raise SystemExit(f"THINKRL_KILL={spec!r}: KIND must be one of {', '.join(KINDS)}")
    target, calls = int(n), 0
    root_path = os.path.realpath(root) if root else None

    def hit() -> bool:
        nonlocal calls
        calls += 1
        return calls == target

    def ours(path) -> bool:
        return root_path is not None and os.path.realpath(path).startswith(root_path + os.sep)

    if kind == "generate":
        from thinkrl.rollout import engines
        from thinkrl.rollout.engines import hf  # noqa: F401  (so that its class is among the subclasses)

        def wrap(cls):
            real_generate = cls.generate

            def generate(self, *a, **k):
                out = real_generate(self, *a, **k)
                if hit():
                    _die(kind, calls)
                return out

            cls.generate = generate

        def every(cls):
            yield cls
            for sub in cls.__subclasses__():
                yield from every(sub)

        for cls in every(engines.Engine):  # each engine class's own generate, whichever the run picks
            if "generate" in vars(cls):
                wrap(cls)
    elif kind == "grade":
        import thinkrl.verifier.pool as mod

        real_wait = mod.wait  # VerifierPool.grade waits on its workers' pipes with samples sent

        def wait(*a, **k):
            if hit():
                _die(kind, calls)
            return real_wait(*a, **k)

        mod.wait = wait
    elif kind == "update":
        import thinkrl.train as mod

        real_update = mod.update

        def update(*a, **k):
            out = real_update(*a, **k)
            if hit():
                _die(kind, calls)
            return out

        mod.update = update
    elif kind == "log":
        import tempfile

        from thinkrl.run.jsonl import JsonlLog

        real_write = JsonlLog.write

        def write(self, records):
            if not hit():
                return real_write(self, records)
            with tempfile.TemporaryDirectory() as d:  # the exact bytes the real write would append
                probe = JsonlLog(Path(d) / "probe.jsonl")
                real_write(probe, records)
                data = probe.path.read_bytes()
            last = data.rstrip(b"\n").rfind(b"\n") + 1  # start of the last record's line
            with self.path.open("ab") as f:  # earlier records whole, the last one cut in half
                f.write(data[: last + (len(data) - last) // 2])
            _die(kind, calls)

        JsonlLog.write = write
    elif kind == "save_weights":
        import thinkrl.run.checkpoint as mod

        real_save_weights = mod.save_weights

        def save_weights(*a, **k):
            real_save_weights(*a, **k)
            if hit():
                _die(kind, calls)

        mod.save_weights = save_weights
    elif kind == "torch.save":
        import torch

        real_save = torch.save

        def save(obj, f, *a, **k):
            if not (isinstance(f, (str, os.PathLike)) and ours(f) and hit()):
                return real_save(obj, f, *a, **k)
            buf = io.BytesIO()
            real_save(obj, buf, *a, **k)
            with open(f, "wb") as fh:
                fh.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            _die(kind, calls)

        torch.save = save
    elif kind in ("replace-before", "replace-after"):
        real_replace = os.replace

        def replace(src, dst, *a, **k):
            if not (ours(src) and hit()):
                return real_replace(src, dst, *a, **k)
            if kind == "replace-after":
                real_replace(src, dst, *a, **k)
            _die(kind, calls)

        os.replace = replace
    elif kind == "rmtree":
        import shutil

        real_rmtree = shutil.rmtree

        def rmtree(path, *a, **k):
            if not (os.path.isdir(path) and ours(path) and hit()):
                return real_rmtree(path, *a, **k)
            files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
            for f in files[: max(1, len(files) // 2)]:  # the way a real rmtree is cut short
                os.unlink(f)
            _die(kind, calls)

        shutil.rmtree = rmtree


def run(
    args: list[str],
    root: Path,
    kill: str | None = None,
    delay: float | None = None,
    stop_when: Callable[[], bool] | None = None,
    log: Path | None = None,
    timeout: float = 900,
) -> tuple[int, str]:
    """Run `thinkrl ARGS` under this driver. With `delay`, SIGKILL it from outside after that many seconds,
    or as soon as `stop_when()` is true (polled; bounds how far a timed life gets on a fast machine).
    Returns (exit status, output); -9 means it was killed. Waits until the processes it started (verifier
    workers) are gone too, and fails if they outlive it by more than 60 s."""
    tests = str(Path(__file__).parent)
    env = {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    env.pop("THINKRL_KILL", None)
    if kill:
        env.update(THINKRL_KILL=kill, THINKRL_KILL_ROOT=str(root))
    log = log or Path(str(root) + ".log")
    # a file, not a pipe: orphaned workers must not hold our read end open
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, *map(str, args)], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + (delay if delay is not None else timeout)
        while proc.poll() is None:
            if time.monotonic() >= deadline or (delay is not None and stop_when is not None and stop_when()):
                proc.kill()  # our own child, by its id
                proc.wait()
                if delay is None:
                    raise TimeoutError(f"thinkrl {' '.join(map(str, args))} ran past {timeout} s; see {log}")
                break
            time.sleep(0.05)
        rc = proc.returncode
    _wait_for_group(proc.pid)
    return rc, log.read_text()


def _living_members(pgid: int) -> list[int]:
    """Processes of group pgid that are not zombies (whether an orphan's zombie is reaped is up to init)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _wait_for_group(pgid: int, limit: float = 60.0) -> None:
    """The driver ran in its own session: wait for every process left in it (orphaned verifier workers
    exit when their pipe closes) and fail if one does not."""
    deadline = time.monotonic() + limit
    while (left := _living_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        for pid in left:  # the processes our driver started; nothing else is in its session
            os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes {left} of the killed trainer were still running {limit:.0f} s after it died")


if __name__ == "__main__":
    if os.environ.get("THINKRL_KILL"):
        install(os.environ["THINKRL_KILL"], os.environ.get("THINKRL_KILL_ROOT", ""))
    from thinkrl.cli import run as cli

    sys.argv[0] = "thinkrl"
    cli()
