"""A new run's --output-dir (thinkrl/run/resume.py check_new_run_dir, forget_failed_start): it refuses a
directory holding a run or the user's own files, accepts what a failed start or `thinkrl eval` of the starting
model left, and a run that fails before its first step leaves the directory to the same command."""

import os
import shutil

import pytest
from test_cli_e2e import tiny_args
from test_faults import error_line, run_cli
from test_resume_guard import run  # noqa: F401  (the fixture: a copy of conftest.py's checkpointed_run)

from thinkrl.errors import UserError
from thinkrl.run import resume


def test_a_new_run_refuses_a_directory_with_the_users_own_files(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("train:\n  lr: 0.1\n")
    (out / "notes.txt").write_text("keep me\n")
    code, err = run_cli(tiny_args(tiny_model_dir, out, 1), capsys)
    line = error_line(err)
    assert code == 2 and f"--output-dir {out} is not empty (config.yaml, notes.txt) and is not a thinkrl run directory" in line, line
    assert line.endswith("choose a new or empty --output-dir") and "model:" not in err
    assert (out / "config.yaml").read_text() == "train:\n  lr: 0.1\n"  # untouched
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "notes.txt"]


@pytest.mark.plain
def test_a_new_run_refuses_an_existing_run_even_before_its_first_step(run, tiny_model_dir, capsys):  # noqa: F811
    config = (run / "config.yaml").read_bytes()
    for keep in (None, {"config.yaml", "data_report.json"}):  # a run, then one that stopped before its first step
        if keep:
            for p in run.iterdir():
                if p.name not in keep:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
        code, err = run_cli(tiny_args(tiny_model_dir, run, 1), capsys)
        line = error_line(err)
        assert code == 2 and line == f"error: {run} already holds a run; continue it with --resume {run} or pick a new --output-dir", line
        assert (run / "config.yaml").read_bytes() == config


@pytest.mark.plain
def test_a_run_that_fails_before_its_first_step_leaves_the_directory_to_the_same_command(tiny_model_dir, tmp_path, capsys):
    """Before: a NaN reward stopped the run but left config.yaml, so the same command was refused (already holds a run)."""
    out = tmp_path / "run"
    nan = "{name: nan, function: helpers:failing_reward, weight: 1, options: {how: nan}}"
    args = tiny_args(tiny_model_dir, out, 1, "-o", f"reward.functions=[{{name: correct, function: verifier, weight: 1}}, {nan}]")
    for _ in range(2):  # the same command twice: the same error, never "already holds a run"
        code, err = run_cli(args, capsys)
        line = error_line(err)
        assert code == 2 and line.startswith("error: reward.functions nan (helpers:failing_reward) returned nan, not a finite"), line
        assert [p.name for p in out.iterdir() if p.name != ".lock"] == [] and not resume.is_run_dir(out)


@pytest.mark.parametrize("made", ["metrics.jsonl", "checkpoints", "a resume", "an error whose fix is --resume"])
def test_a_failed_start_removes_nothing_of_a_run_that_logged_a_step_or_was_resumed(tmp_path, made):
    for name in ("config.yaml", "data_report.json"):
        (tmp_path / name).write_text("{}")
    if made in ("metrics.jsonl", "checkpoints"):
        (tmp_path / made).mkdir() if made == "checkpoints" else (tmp_path / made).write_text("")
    error = UserError(f"step 1: out of GPU memory ...; continue with: thinkrl train --resume {tmp_path}" if made.startswith("an") else "x")
    assert resume.forget_failed_start(tmp_path, made != "a resume")(UserError, error, None) is False
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "data_report.json").exists()
    resume.forget_failed_start(tmp_path, True)(None, None, None)  # a run that ended well keeps everything
    assert (tmp_path / "config.yaml").exists()


def test_an_empty_directory_or_what_a_failed_start_left_is_fine(tmp_path):
    resume.check_new_run_dir(tmp_path / "absent")
    resume.check_new_run_dir(tmp_path)
    for name in (".lock", "data_report.json", f".config.yaml.tmp-{os.getpid()}"):
        (tmp_path / name).write_text("{}")
    resume.check_new_run_dir(tmp_path)
    assert not resume.is_run_dir(tmp_path)
    (tmp_path / ".git").mkdir()  # anything else is the user's
    with pytest.raises(UserError, match=r"is not empty \(\.git\)"):
        resume.check_new_run_dir(tmp_path)


def test_a_new_run_accepts_its_own_evaluation_of_the_starting_model(tmp_path):
    # make demo evaluates the starting model into RUN_DIR/eval/step-0/arith before the run starts
    out = tmp_path / "eval" / "step-0" / "arith"
    out.mkdir(parents=True)
    for name in ("settings.json", "samples.jsonl", "summary.json", ".lock"):
        (out / name).write_text("{}")
    resume.check_new_run_dir(tmp_path)
    (out / "notes.txt").write_text("mine")  # anything else under eval/ is the user's
    with pytest.raises(UserError, match=r"is not empty \(eval\)"):
        resume.check_new_run_dir(tmp_path)
    (out / "notes.txt").unlink()
    (tmp_path / "eval" / "summary.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UserError, match=r"is not empty \(eval\)"):
        resume.check_new_run_dir(tmp_path)
