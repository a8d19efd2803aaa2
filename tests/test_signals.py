"""SIGINT / SIGTERM end to end: the step finishes, is checkpointed, the resume command is printed (exit 0), and
the resumed run matches an uninterrupted one. The trainer runs as `python -m thinkrl` in a subprocess."""

import os
import signal
import subprocess
import sys
import time

import pytest
from test_cli_e2e import invoke, tiny_args
from test_faults import COMPARED, subprocess_env

from thinkrl.run import checkpoint
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.plain  # reaches the CPU speed-ups: make test-plain reruns it (tests/plain_marks.py)


@pytest.fixture(scope="module")
def straight_run(tiny_model_dir, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("straight") / "run"
    invoke(tiny_args(tiny_model_dir, out, 4))
    return read_jsonl(out / "metrics.jsonl")


@pytest.mark.parametrize("signum, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_checkpoints_the_step_and_resume_matches_an_uninterrupted_run(tiny_model_dir, tmp_path, straight_run, signum, to_group):
    """SIGTERM to the trainer (a scheduler), or SIGINT to its whole process group, verifier workers included
    (Ctrl-C in a terminal): the step finishes, is checkpointed, the resume command is printed, exit 0."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkrl", *map(str, tiny_args(tiny_model_dir, out, 4))],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first step"
            time.sleep(0.02)
        (os.killpg if to_group else os.kill)(proc.pid, signum)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert f"continue with: thinkrl train --resume {out}" in err, err
    stopped = len(read_jsonl(out / "metrics.jsonl"))
    assert 1 <= stopped < 4 and checkpoint.latest(out).name == f"step-{stopped}"

    invoke(["train", "--resume", str(out)])
    resumed = read_jsonl(out / "metrics.jsonl")
    assert [{k: m.get(k) for k in COMPARED} for m in resumed] == [{k: m.get(k) for k in COMPARED} for m in straight_run]
    assert all(m["verifier/crashes"] == 0 for m in resumed)  # no worker was killed by the signal
