"""Eval writes that fail (issue 19, "Data and eval"): a file in the way of the output, a read-only directory,
a lock file that cannot be made, a full disk, a read-only file system at the summary. Each ends in one line
that names the path and the fix (exit 2), never a traceback, and what was written before stays."""

import errno
import os
from pathlib import Path

import pytest
from test_data_hostile import eval_args, write_jsonl
from test_faults import error_line, run_cli

from thinkrl.errors import UserError
from thinkrl.evaluation import evaluate as evaluate_mod
from thinkrl.run.jsonl import JsonlLog, read_jsonl


@pytest.fixture
def small(tmp_path):
    return write_jsonl(tmp_path / "small.jsonl", [{"id": f"p{i}", "problem": f"{i} + 1?", "answer": str(i + 1)} for i in range(2)])


def test_a_file_as_output_is_one_line_before_the_model_loads(tmp_path, small, capsys):
    (tmp_path / "taken").write_text("not a directory")
    model = tmp_path / "no-such-model"  # never loaded: the output is checked first
    code, err = run_cli(eval_args(model, small, tmp_path / "taken"), capsys)
    assert code == 2
    taken = tmp_path / "taken"
    assert (
        error_line(err) == f"error: cannot write {taken}: {taken} is a file, not a directory; choose another --output (or move that file)"
    )
    code, err = run_cli(eval_args(model, small, tmp_path / "taken" / "deeper"), capsys)
    assert code == 2 and f"{tmp_path / 'taken'} is a file, not a directory" in error_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_is_one_line(tmp_path, small, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code, err = run_cli(eval_args(tmp_path / "no-such-model", small, locked / "out"), capsys)
    finally:
        locked.chmod(0o755)
    assert code == 2 and f"cannot write {locked / 'out'}: {locked} is not writable" in error_line(err)
    assert "make it writable or choose another --output" in error_line(err)


def test_a_read_only_output_is_one_line_simulated(tmp_path, small, monkeypatch, capsys):
    """The same for root, whom a chmod does not stop: the directory reports itself read-only (EROFS: a read-only mount)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **k: False if Path(path) == locked else real(path, mode, **k))
    code, err = run_cli(eval_args(tmp_path / "no-such-model", small, locked / "out"), capsys)
    assert code == 2 and f"cannot write {locked / 'out'}: {locked} is not writable" in error_line(err)


def test_a_lock_file_that_cannot_be_made_is_one_line(tmp_path, small, monkeypatch, tiny_model_dir, capsys):
    from thinkrl.run.lock import DirLock

    def refused(self):
        raise PermissionError(errno.EACCES, "Permission denied", str(self.path))

    monkeypatch.setattr(DirLock, "acquire", refused)
    out = tmp_path / "out"
    code, err = run_cli(eval_args(tiny_model_dir, small, out), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: cannot write {out / '.lock'} (PermissionError: [Errno 13] Permission denied")
    assert line.endswith("make it writable or choose another --output")


@pytest.mark.plain
def test_a_full_disk_while_writing_samples_is_one_line(tiny_model_dir, tmp_path, small, monkeypatch, capsys):
    def full(self, records):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(JsonlLog, "write", full)
    out = tmp_path / "out"
    code, err = run_cli(eval_args(tiny_model_dir, small, out), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: cannot write {out / 'samples.jsonl'} (OSError: [Errno 28] No space left on device; ")
    assert "GiB free there); free space on that disk or choose another --output" in line


@pytest.mark.plain
def test_a_read_only_file_system_at_the_summary_is_one_line_and_keeps_the_samples(tiny_model_dir, tmp_path, small, monkeypatch, capsys):
    real = evaluate_mod.write_atomic

    def write_atomic(path, data):
        if Path(path).name == "summary.json":  # named by its temporary file, as os.open reports it
            raise OSError(errno.EROFS, "Read-only file system", str(Path(path).with_name(".summary.json.tmp")))
        return real(path, data)

    monkeypatch.setattr(evaluate_mod, "write_atomic", write_atomic)
    out = tmp_path / "out"
    code, err = run_cli(eval_args(tiny_model_dir, small, out), capsys)
    line = error_line(err)
    assert code == 2 and f"cannot write {out / 'summary.json'} (OSError: [Errno 30] Read-only file system" in line
    assert line.endswith(
        "make it writable or choose another --output; the samples already in samples.jsonl are kept and the same command "
        "continues from them"
    )
    assert len(read_jsonl(out / "samples.jsonl")) == 2 and not (out / ".lock").exists()  # the lock is released


def test_a_failed_write_of_evaluation_during_training_speaks_of_the_run(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError, match=r"cannot write .*samples.jsonl \(OSError: \[Errno 28\].*thinkrl train --resume"):
        with evaluate_mod.writing(run_dir / "eval" / "step-2" / "samples.jsonl", run_dir / "eval" / "step-2", run_dir):
            raise OSError(errno.ENOSPC, "No space left on device")  # the trainer's own message (thinkrl/run/faults.py)
