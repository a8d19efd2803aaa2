"""`thinkrl study` refuses what would make its verdict wrong, before anything runs: duplicate arm keys, arm names
that are not plain names, a study directory that is a file or whose study.yaml is damaged, an override nested too
deeply to read. Each is one error line, never a traceback, and leaves no run behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, inject_nan, run_cli
from test_study import spec

from thinkrl.config.load import parse_override
from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl
from thinkrl.study.spec import load_study, parse_study


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_an_arm_written_twice_is_refused_naming_it(tmp_path, capsys):
    path = write(
        tmp_path,
        "name: t\nseeds: 2\nmetrics: [reward/mean]\narms:\n  grpo: {method: grpo}\n  dr: {method: dr_grpo}\n  grpo: {method: gspo}\n",
    )
    code, err = run_cli(["study", str(path), "--output-dir", str(tmp_path / "st")], capsys)
    line = error_line(err)
    assert code == 2 and "key 'grpo' appears twice" in line and "line 7" in line
    assert not (tmp_path / "st").exists()  # refused before anything ran


@pytest.mark.parametrize("name", ["grpo\n", "a\tb", "a\x1bb", "grpo\r"])
def test_an_arm_name_with_a_control_character_or_newline_is_refused(name):
    with pytest.raises(UserError, match="plain directory name"):
        parse_study(spec(arms={name: {"method": "grpo"}, "dr": {"method": "dr_grpo"}}), "s.yaml")


def test_an_output_dir_that_is_a_file_is_one_error_line(tmp_path, capsys):
    path = write(tmp_path, yaml.safe_dump(spec()))
    (tmp_path / "file").write_text("mine")
    code, err = run_cli(["study", str(path), "--output-dir", str(tmp_path / "file"), "--commands"], capsys)
    assert code == 2 and "is a file, not a directory" in error_line(err)
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("damage", ["arms: [unclosed\n", "- a list\n", "name: t\nseeds: 2\ncomparisons: 5\n", "\xff\xfe not text"], ids=str)
def test_a_damaged_study_yaml_is_one_error_line_for_a_rerun_and_for_report(tmp_path, capsys, damage):
    path = write(tmp_path, yaml.safe_dump(spec()))
    out = tmp_path / "st"
    assert run_cli(["study", str(path), "--output-dir", str(out), "--commands"], capsys)[0] == 0
    (out / "study.yaml").write_bytes(damage.encode("latin-1") if "\xff" in damage else damage.encode())
    for args in (["study", str(path), "--output-dir", str(out), "--commands"], ["study", "report", str(out)]):
        code, err = run_cli(args, capsys)
        line = error_line(err)
        assert code == 2 and "study.yaml is damaged" in line and "new --output-dir" in line, line


def test_comparisons_that_are_not_a_list_are_refused():
    with pytest.raises(UserError, match="comparisons is a list"):
        parse_study(spec(comparisons=5), "s.yaml")


def test_a_deeply_nested_override_is_one_error_naming_the_key(tmp_path, capsys):
    with pytest.raises(UserError, match="-o train.lr=...: the value nests too deeply"):
        parse_override("train.lr=" + "[" * 5000)
    path = write(tmp_path, yaml.safe_dump(spec(overrides=["train.lr=" + "[" * 5000])))
    with pytest.raises(UserError, match="nests too deeply"):
        load_study(path)
    code, err = run_cli(["train", "-o", "train.lr=" + "[" * 5000, "--output-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "train.lr" in error_line(err) and not (tmp_path / "run").exists()


@pytest.mark.plain
def test_a_skipped_step_logs_its_entropy_as_nan_and_every_step_its_thread_count(tiny_model_dir, tmp_path, monkeypatch):
    """A step whose every update was skipped as NaN/inf measured no entropy: nan, never 0.0 (which a study would
    average as a real value). Every metrics line records torch's thread count."""
    out = tmp_path / "run"
    inject_nan(monkeypatch, {2})
    invoke(tiny_args(tiny_model_dir, out, 3, "-o", "train.max_nonfinite_steps=0"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["update/skipped_nonfinite"] for m in metrics] == [0, 1, 0]
    assert metrics[1]["entropy"] == "nan" and metrics[1]["loss"] == "nan"
    assert all(isinstance(metrics[i]["entropy"], float) and metrics[i]["entropy"] > 0 for i in (0, 2))
    assert [m["torch/threads"] for m in metrics] == [torch.get_num_threads()] * 3
