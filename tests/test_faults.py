"""Faults end to end through the CLI on the tiny model: NaN/inf updates, failed writes, GPU out of memory
(SIGINT/SIGTERM: tests/test_signals.py). Each must end in one line that says what to do (exit 2), or a clean
stop (exit 0), and never cost the last complete checkpoint or the metrics already logged.

Faults are injected with monkeypatch in-process; one real write failure (a file-size limit) runs
`python -m thinkrl` in a subprocess.
"""

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_cli_e2e import invoke, tiny_args

import thinkrl.learner.logprobs as batch_mod
import thinkrl.setup as setup_mod
import thinkrl.train as train_mod
from thinkrl import cli
from thinkrl.run import checkpoint, faults
from thinkrl.run.jsonl import JsonlLog, read_jsonl

TESTS = Path(__file__).parent
COMPARED = ["reward/mean", "loss", "entropy", "grad_norm", "length/mean", "lr", "verifier/crashes", "verifier/timeouts"]


def run_cli(args, capsys) -> tuple[int, str]:
    """The console script in-process (UserError -> 'error: ...' on stderr, exit 2): (exit code, stderr)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sys, "argv", ["thinkrl", *map(str, args)])
        with pytest.raises(SystemExit) as exit_:
            cli.run()
    return exit_.value.code or 0, capsys.readouterr().err


def subprocess_env() -> dict:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}  # helpers:length_reward resolves


def error_line(err: str) -> str:
    """The CLI's error: one line, the last one, and no traceback anywhere."""
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err
    return last


def adapter(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step-{step}" / "adapter" / "adapter_model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def hidden_dirs(run: Path) -> list[str]:
    return [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def inject_nan(monkeypatch, bad_steps: set[int], first_call_only: bool = False) -> None:
    """The training forward returns NaN log-probs at the given steps (1-based), as an overflowing forward
    would: loss and gradient are then NaN. first_call_only: only the step's first micro-batch (so only its
    first mini-batch). The step comes from the loop's setup.reseed(seed, step + 1)."""
    now = {"step": 0, "calls": 0}
    real_reseed, real_logprobs = setup_mod.reseed, batch_mod.token_logprobs

    def reseed(seed, step, device, rank=0):
        now.update(step=step, calls=0)
        return real_reseed(seed, step, device, rank)

    def token_logprobs(*args, **kwargs):
        now["calls"] += 1
        out = real_logprobs(*args, **kwargs)
        bad = now["step"] in bad_steps and (now["calls"] == 1 or not first_call_only)
        return out._replace(logp=out.logp * float("nan")) if bad else out

    monkeypatch.setattr(setup_mod, "reseed", reseed)
    monkeypatch.setattr(batch_mod, "token_logprobs", token_logprobs)  # what the training forward calls


# --- 1. non-finite loss or gradient


@pytest.mark.plain
def test_nonfinite_updates_are_skipped_counted_and_leave_the_weights_alone(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    inject_nan(monkeypatch, {2, 3})
    invoke(tiny_args(tiny_model_dir, out, 4, "-o", "train.save_every=1", "-o", "train.keep_last=0", "-o", "train.max_nonfinite_steps=0"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # max_nonfinite_steps=0: never stops
    assert [m["update/skipped_nonfinite"] for m in metrics] == [0, 1, 1, 0]
    assert [m["update/optimizer_steps"] for m in metrics] == [1, 0, 0, 1]
    assert metrics[1]["loss"] == "nan" and metrics[1]["grad_norm"] == "nan"  # shown, not hidden as 0.0
    assert metrics[3]["grad_norm"] > 0  # training went on after the bad steps
    # a skipped update changes nothing: weights, Adam's step count; the LR schedule advances (update.py)
    assert same_weights(adapter(out, 1), adapter(out, 2)) and same_weights(adapter(out, 1), adapter(out, 3))
    assert not same_weights(adapter(out, 3), adapter(out, 4))
    adam = [torch.load(out / "checkpoints" / f"step-{s}" / "optimizer.pt")["state"][0]["step"].item() for s in (1, 3, 4)]
    assert adam == [1, 1, 2]
    assert [torch.load(out / "checkpoints" / f"step-{s}" / "scheduler.pt")["last_epoch"] for s in (1, 3)] == [1, 3]


@pytest.mark.plain
def test_one_bad_mini_batch_is_skipped_and_the_others_are_applied(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    inject_nan(monkeypatch, {2}, first_call_only=True)
    invoke(tiny_args(tiny_model_dir, out, 2, "-o", "train.mini_batches=2"))
    second = read_jsonl(out / "metrics.jsonl")[1]
    assert second["update/skipped_nonfinite"] == 1 and second["update/optimizer_steps"] == 1
    assert isinstance(second["loss"], float) and second["grad_norm"] > 0  # the average of the applied update only


@pytest.mark.plain
def test_consecutive_nonfinite_steps_stop_with_a_checkpoint_and_a_lower_lr_resumes(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    inject_nan(monkeypatch, {2, 3, 4})
    args = tiny_args(tiny_model_dir, out, 5, "-o", "train.save_every=1", "-o", "train.keep_last=0", "-o", "train.max_nonfinite_steps=2")
    code, err = run_cli(args, capsys)
    line = error_line(err)
    assert code == 2
    assert line.startswith("error: step 3: the loss or gradient was NaN/inf in every update of the last 2 steps"), line
    for part in ("train.lr=0.05", "NaN reward", "helpers:length_reward", f"thinkrl train --resume {out} -o train.lr=0.005"):
        assert part in line, (part, line)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert checkpoint.latest(out).name == "step-3" and same_weights(adapter(out, 3), adapter(out, 1))  # last good weights

    monkeypatch.undo()  # the fix worked: no more NaN; the lower LR from -o takes effect on resume
    invoke(["train", "--resume", str(out), "-o", "train.lr=0.005"])
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert [m["lr"] for m in metrics[3:]] == [0.005, 0.005] and all(m["update/skipped_nonfinite"] == 0 for m in metrics[3:])


# --- 2. write failures


@pytest.mark.plain
def test_disk_full_during_a_checkpoint_keeps_the_previous_one_and_resume_works(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "step-2" in str(f):  # the second checkpoint: its adapter is written, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "-o", "train.save_every=1"), capsys)
    line = error_line(err)
    assert code == 2
    for part in (
        f"cannot write {out / 'checkpoints' / 'step-2'}",
        "No space left on device",
        "GiB free there",
        f"the last complete checkpoint {out / 'checkpoints' / 'step-1'} is intact",
        "Free space on that disk",
        f"thinkrl train --resume {out}",
    ):
        assert part in line, (part, line)
    assert checkpoint.latest(out).name == "step-1" and hidden_dirs(out) == []  # the partial save is gone
    logged = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in logged] == [1, 2]  # lines written before the failure stay

    monkeypatch.undo()
    invoke(["train", "--resume", str(out)])
    resumed = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in resumed] == [1, 2] and checkpoint.latest(out).name == "step-2"
    assert [{k: m.get(k) for k in COMPARED} for m in resumed] == [{k: m.get(k) for k in COMPARED} for m in logged]


@pytest.mark.plain
def test_disk_full_while_logging_names_the_log_and_keeps_what_is_there(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real_write = JsonlLog.write

    def write(self, records):
        if self.path.name == "metrics.jsonl" and self.path.is_file():  # the second step's line
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, records)

    monkeypatch.setattr(JsonlLog, "write", write)
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "-o", "train.save_every=1"), capsys)
    line = error_line(err)
    assert code == 2 and f"cannot write {out / 'metrics.jsonl'}" in line and "step-1 is intact" in line, line
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1] and checkpoint.latest(out).name == "step-1"


@pytest.mark.parametrize("blocked", ["file", "read-only"])
def test_an_unwritable_output_dir_is_a_one_line_error(tiny_model_dir, tmp_path, monkeypatch, capsys, blocked):
    parent, fix = tmp_path / "parent", "; choose another --output-dir"
    if blocked == "file":
        parent.write_text("")  # --output-dir below a regular file
    elif os.geteuid() == 0:  # root writes into a read-only directory: the refusal is simulated

        def refused(cfg, path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

        monkeypatch.setattr(setup_mod, "save_config", refused)
        fix = "; make it writable or choose another --output-dir"
    else:
        parent.mkdir()
        parent.chmod(0o500)
        fix = "; make it writable or choose another --output-dir"
    code, err = run_cli(tiny_args(tiny_model_dir, parent / "run", 1), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: cannot write {parent / 'run'} (") and line.endswith(fix), line


@pytest.mark.plain
def test_a_real_failed_write_reports_one_line_and_leaves_no_partial_checkpoint(tiny_model_dir, tmp_path):
    """No monkeypatch: a file-size limit makes the kernel refuse the write (EFBIG), which torch.save
    reports as a RuntimeError without errno. The adapter (~66 kB) fits, optimizer.pt (~130 kB) does not."""
    out = tmp_path / "run"

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    result = subprocess.run(
        [sys.executable, "-m", "thinkrl", *map(str, tiny_args(tiny_model_dir, out, 1))],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size,
    )
    line = error_line(result.stderr)
    assert result.returncode == 2
    assert f"cannot write {out / 'checkpoints' / 'step-1'}" in line and "no checkpoint was written yet" in line, line
    assert checkpoint.latest(out) is None and hidden_dirs(out) == []
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1]


# --- 3. GPU out of memory (signals: tests/test_signals.py)


@pytest.mark.parametrize(
    "where, error, retry",
    [
        ("update", torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "-o train.micro_batch_tokens=1024"),
        ("collect", torch.OutOfMemoryError("HIP out of memory. Tried to allocate 512.00 MiB"), "-o rollout.batch_size=32"),
    ],
    ids=["update-cuda.OutOfMemoryError", "generation-OutOfMemoryError"],
)
@pytest.mark.plain
def test_out_of_memory_names_the_memory_settings_and_saves_nothing_new(tiny_model_dir, tmp_path, monkeypatch, capsys, where, error, retry):
    out = tmp_path / "run"
    real, calls = getattr(train_mod, where), {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second step
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, where, failing)
    code, err = run_cli(tiny_args(tiny_model_dir, out, 3, "-o", "train.save_every=1"), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith("error: step 2: out of GPU memory during the "), line
    assert "nothing new was saved, step-1 is the last checkpoint" in line, line
    settings = [
        "train.micro_batch_size=3",
        "train.micro_batch_tokens=2048",
        "train.gradient_checkpointing=auto",
        "rollout.batch_size=64",
        "rollout.max_new_tokens=8",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "model.lora.rank=16",
        f"thinkrl train --resume {out} {retry}",
    ]
    assert all(s in line for s in settings), line
    assert [p.name for p in checkpoint.complete_checkpoints(out)] == ["step-1"] and hidden_dirs(out) == []
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1]


def test_only_out_of_memory_runtime_errors_become_user_errors():
    assert faults.is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert faults.is_out_of_memory(torch.OutOfMemoryError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not faults.is_out_of_memory(RuntimeError("plugin: out of memory budget"))  # words are not an OOM
    assert not faults.is_out_of_memory(RuntimeError("shape mismatch"))  # a bug keeps its traceback
