"""Start several ranks of one command (torchrun, accelerate launch) from a test and wait for them.

A rank now and then aborts in gloo's C++ teardown on a loaded 2-core machine ("terminate called without an
active exception", about one run in five under load, never alone; CI once saw it twice in a row) after its
work is done. That is not what the tests check, so such a launch is repeated, at most twice, and only for
that abort.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun_cmd(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]


def fsdp_cmd() -> list[str]:
    """accelerate launch with the FSDP2 config as shipped (2 processes; on a CPU they run over gloo)."""
    return [str(Path(sys.executable).with_name("accelerate")), "launch", "--config_file", str(ROOT / "configs/accelerate/fsdp.yaml")]


def thinkrl_script() -> list[str]:
    entry = Path(sys.executable).with_name("thinkrl")
    return [str(entry)] if entry.exists() else ["-m", "thinkrl.cli"]


def ranks(cmd: list[str], env: dict | None = None, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    for _ in range(2):
        if not (proc.returncode and TEARDOWN_ABORT in proc.stderr):
            break
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
