"""One process per run directory (thinkrl/run/lock.py): a second process fails in one line naming the
holder's PID, a lock whose holder died is taken over, and training, resume and eval all take it."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from test_cli_e2e import tiny_args
from test_distributed import torchrun
from test_faults import error_line, run_cli, subprocess_env

from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl
from thinkrl.run.lock import NAME, DirLock
from thinkrl.settings import load_config, resolve

HOLD = """
import os, sys, time
from thinkrl.run.lock import DirLock
DirLock(sys.argv[1], "training run").acquire()
if len(sys.argv) > 2:  # the holder forks a child (which shares the locked file) and exits without releasing
    child = os.fork()
    if child == 0:
        time.sleep(600)
        os._exit(0)
    print(child, flush=True)
    os._exit(0)
print("held", flush=True)
time.sleep(600)
"""


def hold(directory: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """A process holding directory's lock, and the first line it printed once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), *extra], stdout=subprocess.PIPE, text=True, env=subprocess_env())
    return proc, proc.stdout.readline().strip()


def lock_message(directory: Path) -> str:
    with pytest.raises(UserError) as e:
        DirLock(directory, "training run").acquire()
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_a_second_process_fails_naming_the_holder_and_a_killed_holders_lock_is_taken_over(tmp_path, capsys):
    proc, line = hold(tmp_path)
    try:
        assert line == "held"
        message = lock_message(tmp_path)
        assert f"PID {proc.pid} on {socket.gethostname()}" in message and "another training run" in message, message
        assert f"kill {proc.pid}" in message and "another --output-dir" in message, message
    finally:
        proc.kill()  # SIGKILL: no cleanup, the lock file stays behind with the dead PID in it
        proc.wait()
    assert json.loads((tmp_path / NAME).read_text())["pid"] == proc.pid
    with DirLock(tmp_path, "training run"):
        assert json.loads((tmp_path / NAME).read_text())["pid"] == os.getpid()
    assert f"took over {tmp_path / NAME} (PID {proc.pid}" in capsys.readouterr().err
    assert not (tmp_path / NAME).exists()


def test_released_on_normal_exit_and_on_an_exception(tmp_path):
    with DirLock(tmp_path / "new" / "dir", "evaluation") as held:  # the directory is created
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
    assert not held.path.exists()
    with pytest.raises(KeyError), DirLock(tmp_path, "training run"):
        assert (tmp_path / NAME).exists()
        raise KeyError("inside the lock")
    assert not (tmp_path / NAME).exists()
    with DirLock(tmp_path, "training run"):  # nothing left held
        pass


def test_the_same_process_cannot_take_it_twice_and_a_failed_try_keeps_the_first(tmp_path):
    with DirLock(tmp_path, "training run"):
        assert f"PID {os.getpid()}" in lock_message(tmp_path)
        assert f"PID {os.getpid()}" in lock_message(tmp_path)  # the failed try did not release the first lock
        proc, line = hold(tmp_path)
        proc.wait(timeout=60)
        assert proc.returncode == 1 and line == ""  # nor can another process take it


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", '{"pid": "x"}'])
def test_an_empty_or_corrupt_lock_file_nobody_holds_is_stale(tmp_path, content):
    (tmp_path / NAME).write_text(content)
    with DirLock(tmp_path, "training run"):
        assert json.loads((tmp_path / NAME).read_text())["pid"] == os.getpid()
    assert not (tmp_path / NAME).exists()


def test_a_file_replaced_while_waiting_is_not_a_lock(tmp_path):
    """A process that opened the file a holder then released must not lock the unlinked file."""
    first = DirLock(tmp_path, "training run")
    first.acquire()
    old = os.open(first.path, os.O_RDWR)
    first.release()
    with DirLock(tmp_path, "training run"):
        assert DirLock(tmp_path, "training run")._lock(old) is False  # flock on the old file works, but it is not the lock
        assert f"PID {os.getpid()}" in lock_message(tmp_path)


def test_a_child_that_outlives_its_parent_keeps_the_lock_and_the_message_says_so(tmp_path):
    proc, child = hold(tmp_path, "fork")
    proc.wait(timeout=60)
    try:
        message = lock_message(tmp_path)
        assert f"PID {proc.pid} has exited, but a process it started still holds the lock" in message, message
    finally:
        os.kill(int(child), signal.SIGKILL)
    for _ in range(100):  # the kernel drops the lock when the child is gone
        try:
            with DirLock(tmp_path, "training run"):
                break
        except UserError:
            time.sleep(0.1)
    else:
        pytest.fail("the lock outlived every process holding it")


def test_default_run_directories_started_in_the_same_second_differ(monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-120000")
    a, b = (resolve(load_config()).output_dir for _ in range(2))
    assert a != b and a.startswith("runs/20250101-120000-") and b.endswith("-grpo"), (a, b)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo")
@pytest.mark.plain
def test_the_processes_of_one_torchrun_share_one_default_run_directory(tiny_model_dir, tmp_path):
    """Each rank resolves the config itself, so each draws its own default name: rank 0's is the one used."""
    entry = Path(sys.executable).with_name("thinkrl")
    script = [str(entry)] if entry.exists() else ["-m", "thinkrl.cli"]
    overrides = ["train.steps=1", "rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=6", "verifier.workers=1"]
    torchrun(2, *script, "train", "--model", str(tiny_model_dir), *(a for o in overrides for a in ("-o", o)), cwd=tmp_path)
    (run,) = (tmp_path / "runs").iterdir()
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1] and not (run / NAME).exists()


def wait_for(proc: subprocess.Popen, path: Path, what: str) -> None:
    deadline = time.monotonic() + 300
    while not (path.exists() and path.read_text().strip()):
        assert proc.poll() is None, f"the holder exited ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after 300 s"
        time.sleep(0.2)


@pytest.mark.plain
def test_a_running_training_refuses_a_resume_and_a_second_run(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "thinkrl", *tiny_args(tiny_model_dir, out, 100_000)]
    holder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        wait_for(holder, out / "metrics.jsonl", "first step")
        for args in (["train", "--resume", out], tiny_args(tiny_model_dir, out, 2)):
            code, err = run_cli(args, capsys)
            line = error_line(err)
            assert code == 2 and f"in use by another training run (PID {holder.pid} on {socket.gethostname()}" in line, line
            assert "model:" not in err, err  # refused before setup: nothing loaded, not even the checkpoint
        holder.send_signal(signal.SIGTERM)  # finish the step, checkpoint, exit
        assert holder.wait(timeout=300) == 0, holder.stderr.read()[-3000:]
    finally:
        holder.kill()
        holder.wait()
    steps = [m["step"] for m in read_jsonl(out / "metrics.jsonl")]
    assert steps == list(range(1, len(steps) + 1)), steps  # one writer: no step twice
    assert not (out / NAME).exists()  # released on the clean stop


PAUSE = """
import sys, time
import thinkrl.run.jsonl as jsonl
from thinkrl import cli
write = jsonl.JsonlLog.write
def write_then_wait(self, records):
    write(self, records)
    time.sleep(600)
jsonl.JsonlLog.write = write_then_wait
sys.argv = ["thinkrl", *sys.argv[1:]]
cli.run()
"""


def test_eval_takes_its_output_lock_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from thinkrl.evaluation import evaluate as evaluate_mod

    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    data.write_text(json.dumps({"id": "p", "problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    monkeypatch.setattr(evaluate_mod, "load_for_eval", lambda *a: pytest.fail("the model loaded while another evaluation held the output"))
    with DirLock(out, "evaluation"):
        code, err = run_cli(["eval", "--model", tmp_path / "a-model", "--dataset", data, "--output", out], capsys)
    line = error_line(err)
    assert code == 2 and f"{out} is in use by another evaluation (PID {os.getpid()}" in line, line


@pytest.mark.plain
def test_two_evals_into_one_output_the_second_fails_then_takes_over(tiny_model_dir, tmp_path, capsys):
    data, out = tmp_path / "data.jsonl", tmp_path / "out"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"Find {i} + {i}.", "answer": str(2 * i)}) + "\n" for i in range(4)))
    args = ["eval", "--model", tiny_model_dir, "--dataset", data, "--n", "4", "--max-new-tokens", "6", "--output", out]
    cmd = [sys.executable, "-c", PAUSE, *map(str, args)]
    holder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        wait_for(holder, out / "samples.jsonl", "samples")  # the holder paused after writing its first samples
        code, err = run_cli(args, capsys)
        line = error_line(err)
        assert code == 2 and f"{out} is in use by another evaluation (PID {holder.pid}" in line and "another --output" in line, line
    finally:
        holder.kill()
        holder.wait()
    code, err = run_cli(args, capsys)  # the holder was killed: its lock is stale, the eval resumes
    assert code == 0 and "took over" in err, err
    keys = [(r["id"], r["sample"]) for r in read_jsonl(out / "samples.jsonl")]
    assert len(keys) == len(set(keys)) == 16, keys
