"""Small files of a run are written atomically (thinkrl/run/atomic.py): a full disk halfway through leaves the
previous file whole and no temporary file, the error is one line naming the run directory and the fix, and a
temporary file left by a killed writer is swept by the next write."""

import errno
import os
import subprocess
import sys

import pytest
from test_cli_e2e import tiny_args
from test_faults import error_line, run_cli

from thinkrl.run import atomic, resume
from thinkrl.settings import load_config, resolve, save_config


def config_for(tmp_path, *overrides: str):
    """A resolved config with the given overrides, for files written under tmp_path."""
    return resolve(load_config(None, ["verifier.workers=1", *overrides], output_dir=str(tmp_path)))


def fail_after_half(monkeypatch, name: str) -> None:
    """Writing a file called `name` (through its temporary file) runs out of room halfway."""
    real = atomic._write

    def write(fd, data):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(f".{name}.tmp"):
            real(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(atomic, "_write", write)


def test_a_full_disk_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    cfg = config_for(tmp_path)
    save_config(cfg, path)
    before = path.read_bytes()
    fail_after_half(monkeypatch, "config.yaml")
    with pytest.raises(OSError, match="No space left"):
        save_config(config_for(tmp_path, "train.lr=0.5"), path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_full_disk_on_data_report_is_one_line_and_leaves_no_empty_file(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    fail_after_half(monkeypatch, "data_report.json")
    code, err = run_cli(tiny_args(tiny_model_dir, out, 1), capsys)
    line = error_line(err)
    assert code == 2 and f"error: cannot write {out} (OSError: [Errno {errno.ENOSPC}] No space left on device" in line, line
    assert line.endswith("choose another --output-dir"), line
    assert sorted(p.name for p in out.iterdir()) == []  # no empty data_report.json, no temporary file, no config.yaml
    resume.check_new_run_dir(out)  # so the same command works once there is room


def test_a_temporary_file_left_by_a_killed_writer_is_swept_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".data_report.json.tmp-{dead}"  # a process killed between writing and renaming
    stale.write_text("{half")
    atomic.write_atomic(tmp_path / "data_report.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data_report.json"]
