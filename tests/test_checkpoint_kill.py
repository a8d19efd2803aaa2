"""A trainer killed with SIGKILL keeps its last complete checkpoint and resumes exactly; checkpoints never
unpickle arbitrary objects; logs and checkpoint rotation survive a kill at any point of their writes.

The subprocess runs go through tests/killpoints.py, which makes the trainer SIGKILL itself at a chosen call.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from killpoints import run
from safetensors.torch import load_file, save_file
from test_cli_e2e import tiny_args
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.run import checkpoint
from thinkrl.run.jsonl import JsonlLog, read_jsonl

DETERMINISTIC = ["step", "reward/mean", "loss", "grad_norm", "entropy", "length/mean"]


def deterministic(run_dir):
    return [{k: m[k] for k in DETERMINISTIC} for m in read_jsonl(run_dir / "metrics.jsonl")]


def adapter(ckpt):
    return load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))


def hidden(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("."))


@pytest.mark.plain
def test_kill_while_writing_a_checkpoint_resumes_from_the_one_before(tiny_model_dir, tmp_path):
    args = tiny_args(tiny_model_dir, tmp_path / "straight", 4, "-o", "train.save_every=1")
    assert run(args, tmp_path / "straight")[0] == 0

    # torch.save runs 3 times per checkpoint (optimizer, scheduler, method): the 7th writes step-3's optimizer.pt
    out = tmp_path / "killed"
    rc, log = run(tiny_args(tiny_model_dir, out, 4, "-o", "train.save_every=1"), out, kill="torch.save:7")
    assert rc == -9 and "killpoint torch.save 7" in log, log[-2000:]
    ckpts = out / "checkpoints"
    (tmp,) = hidden(out)
    assert tmp.startswith(".tmp-step-3-") and not (ckpts / tmp / checkpoint.MARKER).exists()
    assert (ckpts / tmp / "optimizer.pt").stat().st_size < (ckpts / "step-2" / "optimizer.pt").stat().st_size  # cut short
    assert not (ckpts / "step-3").exists() and [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]

    # the temporary directory is invisible; step-2 is complete and every file of it loads safely
    assert checkpoint.latest(out) == ckpts / "step-2"
    assert checkpoint.complete_checkpoints(out) == [ckpts / "step-1", ckpts / "step-2"]
    assert adapter(ckpts / "step-2") and json.loads((ckpts / "step-2" / "trainer_state.json").read_text())["step"] == 2
    for name in ("optimizer.pt", "scheduler.pt", "method.pt"):
        checkpoint._load_pt(ckpts / "step-2" / name)
    with pytest.raises(UserError, match="could not be read"):  # what the marker protects a resume from
        checkpoint._load_pt(ckpts / tmp / "optimizer.pt")

    rc, log = run(["train", "--resume", out], out)
    assert rc == 0, log[-3000:]
    assert "from step-2" in log
    assert hidden(out) == [], "the dead run's temporary directory was not cleaned up"
    assert deterministic(out) == deterministic(tmp_path / "straight") and len(deterministic(out)) == 4
    final, reference = adapter(ckpts / "step-4"), adapter(tmp_path / "straight" / "checkpoints" / "step-4")
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)
    assert [p.name for p in checkpoint.complete_checkpoints(out)] == ["step-3", "step-4"]  # keep_last=2


class Planted:
    """Unpickling this creates a file: proof that a checkpoint ran code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def resume_error(run_dir):
    """The one-line error of a refused resume (the CLI prints a UserError as `error: ...`, exit 2)."""
    result = CliRunner().invoke(app, ["train", "--resume", str(run_dir), "-o", "train.steps=2"])
    if isinstance(result.exception, UserError):
        return str(result.exception)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return result.output


@pytest.mark.plain
def test_checkpoints_load_only_tensors_and_safetensors(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, tiny_args(tiny_model_dir, out, 1), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ckpt = out / "checkpoints" / "step-1"
    assert not list(ckpt.rglob("*.bin")) and (ckpt / "adapter" / "adapter_model.safetensors").is_file()

    # an optimizer.pt that would run code when unpickled is refused, and nothing ran
    good = (ckpt / "optimizer.pt").read_bytes()
    ran = tmp_path / "code-ran"
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)
    torch.save({**state, "extra": Planted(str(ran))}, ckpt / "optimizer.pt")
    message = resume_error(out)
    assert "optimizer.pt holds objects other than tensors" in message and "weights_only=True" in message
    assert not ran.exists()

    # weights only from safetensors: a pickled adapter_model.bin in its place is not read
    (ckpt / "optimizer.pt").write_bytes(good)
    weights = ckpt / "adapter" / "adapter_model.safetensors"
    torch.save(load_file(str(weights)), ckpt / "adapter" / "adapter_model.bin")
    weights.unlink()
    assert "no adapter/adapter_model.safetensors" in resume_error(out)


# --- logs: a kill mid-write leaves a torn last line; resuming must read past it and never lose lines


def test_a_torn_last_line_is_skipped_cut_off_and_truncated_away(tmp_path):
    log = JsonlLog(tmp_path / "m.jsonl")
    log.write([{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}])
    with log.path.open("a") as f:
        f.write('{"step": 3, "x"')  # killed mid-line
    assert [r["step"] for r in read_jsonl(log.path)] == [1, 2]
    log.write({"step": 3, "x": 3.0})  # the next write cuts the fragment off instead of gluing onto it
    assert [r["step"] for r in read_jsonl(log.path)] == [1, 2, 3] and log.path.read_text().count("\n") == 3

    with log.path.open("a") as f:
        f.write('{"step": 4, "x": 4.0}\n{"step": 5')
    log.truncate_after(3)
    assert log.path.read_text() == '{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x": 3.0}\n'
    log.truncate_after(3)  # nothing to drop: untouched

    with log.path.open("a") as f:
        f.write('{"step": 4, "x": 4.0}')  # whole record, only its newline lost: kept
    log.write({"step": 5, "x": 5.0})
    assert [r["step"] for r in read_jsonl(log.path)] == [1, 2, 3, 4, 5]


def test_a_damaged_line_inside_a_log_is_an_error_not_silently_dropped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)
    with pytest.raises(ValueError, match="line 2"):
        JsonlLog(path).truncate_after(1)


def test_truncating_a_log_is_atomic(tmp_path, monkeypatch):
    log = JsonlLog(tmp_path / "m.jsonl")
    log.write([{"step": s} for s in (1, 2, 3)])
    before = log.path.read_text()

    class Killed(BaseException):
        pass

    def killed(*a):
        raise Killed  # the state a SIGKILL just before the rename leaves

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(Killed):
        log.truncate_after(1)
    assert log.path.read_text() == before  # the lines up to the resumed step are never at risk
    monkeypatch.undo()
    log.truncate_after(1)
    assert read_jsonl(log.path) == [{"step": 1}]


# --- checkpoint rotation and leftovers, with stand-in objects (no model needed)


class Stub:
    """Stands in for the model (a peft one: has peft_config), optimizer, scheduler and method."""

    peft_config: dict = {}

    def save_pretrained(self, directory):
        directory.mkdir(parents=True)
        save_file({"w": torch.ones(2)}, str(directory / "adapter_model.safetensors"))

    def state_dict(self):
        return {"n": torch.zeros(3)}


def save(run_dir, step, keep_last=2):
    s = Stub()
    return checkpoint.save(run_dir, step, s, None, s, s, s, {}, keep_last)


class Killed(BaseException):
    pass


def test_a_kill_while_rotating_never_leaves_a_half_deleted_checkpoint(tmp_path, monkeypatch):
    for step in (1, 2):
        save(tmp_path, step)
    real_rmtree = shutil.rmtree

    def cut_short(path, *a, **k):  # deletes one file, then the process "dies"
        if os.path.isdir(path):
            os.unlink(next(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs))
            raise Killed
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", cut_short)
    with pytest.raises(Killed):
        save(tmp_path, 3)  # rotation deletes step-1
    monkeypatch.undo()
    # step-1 was renamed aside before the delete began: every visible checkpoint is whole
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-2", "step-3"]
    assert hidden(tmp_path) == [f".old-step-1-{os.getpid()}"]
    save(tmp_path, 4)
    assert hidden(tmp_path) == [] and [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-3", "step-4"]


def test_leftovers_of_dead_processes_are_removed_and_of_live_ones_kept(tmp_path):
    save(tmp_path, 1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    root = tmp_path / "checkpoints"
    for name in (f".tmp-step-2-{dead}", f".old-step-0-{dead}", f".tmp-step-2-{os.getppid()}", "step-2"):
        (root / name).mkdir()  # step-2 without its marker: an unfinished checkpoint of an older thinkrl
    assert checkpoint.latest(tmp_path) == root / "step-1"
    assert sorted(p.name for p in checkpoint.remove_stale(tmp_path)) == [f".old-step-0-{dead}", f".tmp-step-2-{dead}"]
    assert hidden(tmp_path) == [f".tmp-step-2-{os.getppid()}"]  # its process is alive: maybe still writing
    save(tmp_path, 2)  # replaces the unfinished step-2
    assert (root / "step-2" / checkpoint.MARKER).is_file() and checkpoint.latest(tmp_path) == root / "step-2"
