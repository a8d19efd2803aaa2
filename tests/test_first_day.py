"""A new user's first commands: what they are told, how fast a mistake fails, what is left behind."""

from __future__ import annotations

import pytest
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, run_cli
from typer.testing import CliRunner

from thinkrl import setup
from thinkrl.cli import app


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model is an error: what the test checks must fail before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the mistake was found")

    monkeypatch.setattr(setup, "load_policy", refuse)


def test_a_missing_dataset_fails_before_the_model_loads_and_leaves_no_run_directory(tiny_model_dir, tmp_path, capsys, no_model):
    out = tmp_path / "run"
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "--dataset", str(tmp_path / "nope.jsonl")), capsys)
    assert code == 2 and "dataset file not found" in error_line(err)
    assert not out.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "function, message",
    [
        ("no_such_module:f", "reward.functions bad: function"),
        ("thinkrl.rewards:format_boxed", "cannot be called as fn(completion, answer, width=...)"),
    ],
)
def test_a_bad_reward_function_fails_before_the_model_loads(tiny_model_dir, tmp_path, capsys, no_model, function, message):
    out = tmp_path / "run"
    options = ", options: {width: 3}" if "format_boxed" in function else ""
    bad = f"[{{name: bad, function: '{function}', weight: 1{options}}}]"
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "-o", f"reward.functions={bad}"), capsys)
    assert code == 2 and message in error_line(err), err
    assert not out.exists()


def test_a_bad_model_leaves_no_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run_cli(["train", "--model", str(tmp_path / "no-model"), "--output-dir", str(out)], capsys)
    assert code == 2 and "does not exist" in error_line(err) and not out.exists()


@pytest.mark.plain
def test_the_run_directory_and_settings_come_first_and_an_on_policy_run_is_named(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 1, "--method", "gspo", "--no-recipe"))
    first = result.output.strip().splitlines()[0]
    assert first.startswith(f"run directory: {out}") and "method gspo, no recipe" in first
    assert "note: gspo acts only through its importance ratios" in result.output
    assert "Loading weights" not in result.output  # transformers' own progress bars are silenced


def test_override_with_a_space_is_explained(tiny_model_dir, tmp_path, capsys):
    code, err = run_cli(["train", "-o", "train.lr", "1e-5"], capsys)
    assert code == 2 and error_line(err) == "error: -o train.lr 1e-5: write each override as one argument KEY=VALUE, e.g. -o train.lr=1e-5"


@pytest.mark.plain
def test_resume_with_another_method_is_refused_in_one_line(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    invoke(tiny_args(tiny_model_dir, out, 1, "--method", "dr_grpo"))
    code, err = run_cli(["train", "--resume", str(out), "--method", "grpo"], capsys)
    assert code == 2 and f"--resume {out} continues a dr_grpo run; drop --method grpo" in error_line(err)


@pytest.mark.parametrize("method", ["ctpo", "dapo"])
def test_thinkrl_config_prints_every_key_with_the_recipe_marked(method):
    result = CliRunner().invoke(app, ["config", "--method", method])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("train.lr = 0.0002") and "Peak learning rate" in line for line in lines)
    if method == "ctpo":
        assert any(line.startswith("train.mini_batches = 4  (recipe)") for line in lines)
        assert any(line.startswith("method.variant = 'cumprod'") for line in lines)
    else:
        assert any(line.startswith("rollout.dynamic_sampling = True  (recipe)") for line in lines)


def test_methods_help_prints_the_recipe():
    result = CliRunner().invoke(app, ["methods", "ctpo"])
    assert "Recipe (applied by --method NAME" in result.output and "train.mini_batches = 4" in result.output


@pytest.mark.plain
def test_the_step_line_shows_grad_norm_and_zero_std_groups(tiny_model_dir, tmp_path):
    result = invoke(tiny_args(tiny_model_dir, tmp_path / "run", 1))
    line = next(x for x in result.output.splitlines() if x.strip().startswith("step    1/1"))
    assert "grad_norm " in line and "zero-std groups " in line
