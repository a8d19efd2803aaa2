"""Running a study's grid: one ordinary `thinkrl train` run per arm and seed, N at a time, resumable.

A study directory holds study.yaml (the study as declared when it first ran: its metrics and comparisons may not
change afterwards), inputs.json (the sha256 of every file it reads: thinkrl/study/inputs.py), runs/ARM/seed-K/
(run directories), logs/ARM-seed-K.log (each run's output) and the report.
A run whose final checkpoint exists is done; one with a config.yaml continues with --resume; every run is a
plain command line (`--commands` prints them), so any scheduler can run the grid instead.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from thinkrl.errors import UserError
from thinkrl.run.checkpoint import complete_checkpoints
from thinkrl.run.console import console, progress
from thinkrl.run.lock import in_use
from thinkrl.study import inputs
from thinkrl.study.spec import Cell, Study, parse_study, read_yaml

DECLARED = "study.yaml"


def check_study_dir(study_dir: Path) -> None:
    """The study directory can be one: not an existing file (checked before anything runs)."""
    if study_dir.exists() and not study_dir.is_dir():
        raise UserError(f"--output-dir {study_dir} is a file, not a directory: name a new or empty directory for the study")


def read_declared(study_dir: Path) -> Study:
    """The study that study_dir/study.yaml declares, or one UserError saying it is damaged and what to do."""
    declared = study_dir / DECLARED
    try:
        return parse_study(read_yaml(declared, "declared study", "written by thinkrl study"), str(declared))
    except UserError as e:
        raise UserError(f"{declared} is damaged ({e}); restore it from a copy, or start the study again in a new --output-dir") from None


def open_study(study: Study, study_dir: Path) -> None:
    """Create the study directory with the declared study, or check that it holds this same study."""
    check_study_dir(study_dir)
    declared = study_dir / DECLARED
    if declared.is_file():
        before = read_declared(study_dir)
        if before != study:
            raise UserError(
                f"{study_dir} holds another study ({declared}): its arms, seeds, metrics and comparisons were declared "
                "before it ran and may not change; use another --output-dir for the new study"
            )
        inputs.check(study, study_dir)  # the files it reads: the same bytes as when it started
        return
    if study_dir.exists() and any(study_dir.iterdir()):
        raise UserError(f"{study_dir} is not empty and holds no {DECLARED}: use a new or empty --output-dir for the study")
    prints = inputs.fingerprint(study)  # before the directory exists: a bad config or data name leaves none
    study_dir.mkdir(parents=True, exist_ok=True)
    declared.write_text(study.to_yaml())
    (study_dir / inputs.INPUTS).write_text(json.dumps(prints, indent=1) + "\n")


def cells(study: Study, study_dir: Path) -> list[Cell]:
    """Every run of the grid with its state, seed-major (every arm's seed 0 first), so a partial grid is paired."""
    out = []
    for seed in study.seeds:
        for arm in study.arms:
            run_dir = study_dir / "runs" / arm.name / f"seed-{seed}"
            cell = Cell(arm, seed, run_dir, study_dir / "logs" / f"{arm.name}-seed-{seed}.log")
            cell.state = run_state(run_dir)
            out.append(cell)
    return out


def run_state(run_dir: Path) -> str:
    config = run_dir / "config.yaml"
    if not config.is_file():
        return "pending"
    steps = (yaml.safe_load(config.read_text()).get("train") or {}).get("steps")
    done = any(c.name == f"step-{steps}" for c in complete_checkpoints(run_dir))
    return "done" if done else "partial"


def command(study: Study, cell: Cell) -> list[str]:
    """The `thinkrl train` command line of one cell."""
    base = [sys.executable, "-m", "thinkrl", "train"]
    plugins = ["--plugins", study.plugins] if study.plugins else []
    if cell.state == "partial":
        return [*base, *plugins, "--resume", str(cell.run_dir)]
    config = [study.config] if study.config else []
    overrides = [x for o in (*study.overrides, *cell.arm.overrides, f"train.seed={cell.seed}") for x in ("-o", o)]
    return [*base, *config, *plugins, "--method", cell.arm.method, "--recipe", study.recipe, *overrides, "--output-dir", str(cell.run_dir)]


def shell_line(study: Study, cell: Cell) -> str:
    """What `--commands` prints: the command with `thinkrl` for the interpreter, shell-quoted, one line."""
    return shlex.join(["thinkrl", *command(study, cell)[3:]])


def run_grid(study: Study, study_dir: Path, jobs: int) -> list[Cell]:
    """Run every cell that is not done, `jobs` at a time; returns the cells that failed. Ctrl-C (or SIGTERM) asks
    the running ones to checkpoint and stop, then stops: run the same command again to continue."""
    todo = [c for c in cells(study, study_dir) if c.state != "done"]
    total = len(study.arms) * len(study.seeds)
    devices = _devices()
    running: dict[int, tuple[Cell, subprocess.Popen]] = {}
    failed: list[Cell] = []
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's SIGTERM stops the grid as Ctrl-C does
    with progress() as bar:
        task = bar.add_task(study.name, total=total, completed=total - len(todo), info="")
        try:
            while todo or running:
                free = [c for c in todo if not in_use(c.run_dir)]  # a run a killed study left stopping: wait for it
                while free and len(running) < jobs:
                    slot = next(i for i in range(jobs) if i not in running)
                    cell = free.pop(0)
                    todo.remove(cell)
                    cell.state = run_state(cell.run_dir)  # it may have checkpointed (or finished) since the grid was read
                    if cell.state == "done":
                        bar.advance(task)
                        continue
                    running[slot] = (cell, _start(study, cell, _env(slot, jobs, devices)))
                for slot, (cell, proc) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    del running[slot]
                    if proc.returncode == 0 and run_state(cell.run_dir) == "done":
                        bar.advance(task)
                    else:
                        failed.append(cell)
                bar.update(task, info=", ".join(f"{c.arm.name}/seed-{c.seed}" for c, _ in running.values()))
                time.sleep(0.5)
        except KeyboardInterrupt:
            _stop(running)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    return failed


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


# Runs the command after asking the kernel for SIGTERM when the study process dies, however it dies (SIGKILL
# included): a run then checkpoints and stops, and the next `thinkrl study` resumes it. Set in the child itself
# (then exec), not in a preexec_fn, which is unsafe in a process with threads (the progress bar's).
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    "try:\n    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)\n"
    "except (OSError, AttributeError):\n    pass\n"
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _start(study: Study, cell: Cell, env: dict[str, str]) -> subprocess.Popen:
    cell.log.parent.mkdir(parents=True, exist_ok=True)
    cell.run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(cell.log, "a") as log:
        log.write(f"$ {shell_line(study, cell)}\n")
        log.flush()
        guarded = [sys.executable, "-c", _ORPHAN_GUARD, *command(study, cell)]
        return subprocess.Popen(guarded, stdout=log, stderr=subprocess.STDOUT, env=env)


def _stop(running: dict[int, tuple[Cell, subprocess.Popen]]) -> None:
    """Each running run finishes its step, checkpoints and exits (a second Ctrl-C stops them at once)."""
    for _, proc in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    console.print(f"stopping {len(running)} run(s) after their current step; they checkpoint first")
    try:
        for _, proc in running.values():
            proc.wait()
    except KeyboardInterrupt:
        for _, proc in running.values():
            proc.kill()


def _devices() -> list[str]:
    """The GPUs to spread runs over (one run per device at a time), or [] on a CPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def _env(slot: int, jobs: int, devices: list[str]) -> dict[str, str]:
    """A child's environment: its own GPU, or on a CPU its share of the cores (runs side by side on all cores
    would each start one thread per core and slow one another down)."""
    env = dict(os.environ)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = devices[slot % len(devices)]
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    return env


def last_error(log: Path) -> str:
    """The line that says why a run failed (its `error:` line, else the log's last line)."""
    if not log.is_file():
        return "no log"
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(empty log)"])[-1]
