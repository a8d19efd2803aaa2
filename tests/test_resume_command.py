"""The resume commands thinkrl prints (on a stop, a failure, in fault messages and hints) are shell-quoted,
so a run directory with a space or a quote in its name pastes into a shell as it is."""

import shlex
import shutil
from pathlib import Path

import pytest
from test_atomic_writes import config_for, fail_after_half
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, run_cli
from test_resume_guard import steps

from thinkrl.run import faults


def pasted(text: str, after: str) -> list[str]:
    """The words a shell makes of the command printed after `after` (the rest of that line)."""
    return shlex.split(text.split(after, 1)[1].splitlines()[0])


@pytest.fixture
def spaced_run(checkpointed_run, tmp_path) -> Path:
    out = tmp_path / "my run's dir"
    shutil.copytree(checkpointed_run, out)
    return out


@pytest.mark.plain
def test_the_resume_command_printed_on_a_stop_or_a_failure_pastes_into_a_shell(spaced_run, monkeypatch, capsys):
    class Stopped:  # as after a Ctrl-C during the first step
        stop = True

        def restore(self) -> None:
            pass

    monkeypatch.setattr(faults, "StopFlag", Stopped)
    result = invoke(["train", "--resume", str(spaced_run), "-o", "train.steps=4"])
    assert pasted(result.output, "continue with: ") == ["thinkrl", "train", "--resume", str(spaced_run)], result.output
    assert steps(spaced_run) == [1, 2, 3]
    monkeypatch.undo()
    fail_after_half(monkeypatch, "config.yaml")
    code, err = run_cli(["train", "--resume", spaced_run, "-o", "train.steps=4"], capsys)
    line = error_line(err)
    assert code == 2 and pasted(line, "continue with: ") == ["thinkrl", "train", "--resume", str(spaced_run)], line


def test_the_resume_commands_of_fault_messages_and_hints_paste_into_a_shell(spaced_run, tiny_model_dir, capsys):
    cfg = config_for(spaced_run)
    line = faults.nonfinite_message(cfg, 3, 2, spaced_run, "float32")
    assert pasted(line, "Continue with: ") == ["thinkrl", "train", "--resume", str(spaced_run), "-o", f"train.lr={cfg.train.lr / 10:g}"]
    line = faults.out_of_memory_message(cfg, 3, "update", spaced_run)
    assert pasted(line, "Continue with a smaller one: ")[:4] == ["thinkrl", "train", "--resume", str(spaced_run)], line
    # a smaller completion budget changes what is sampled: the command says --allow-changes, so it is not refused
    cfg.train.micro_batch_tokens, cfg.train.micro_batch_size = 0, 1
    line = faults.out_of_memory_message(cfg, 3, "update", spaced_run)
    assert pasted(line, "Continue with a smaller one: ")[3:] == [str(spaced_run), "-o", "rollout.max_new_tokens=24", "--allow-changes"]
    code, err = run_cli(tiny_args(tiny_model_dir, spaced_run, 1), capsys)  # a new run into it: the hint names the resume
    line = error_line(err)
    assert code == 2 and pasted(line, "continue it with ")[:2] == ["--resume", str(spaced_run)], line
