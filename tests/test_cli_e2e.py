"""End to end through the CLI on the tiny random model: a run, its files, eval of it, resume, errors."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.plain  # reaches the CPU speed-ups: make test-plain reruns it (tests/plain_marks.py)

STEP_FIELDS = {
    "step",
    "reward/mean",
    "reward/std",
    "loss",
    "entropy",
    "length/mean",
    "length/max",
    "length/min",
    "length/truncated_frac",
    "frac_reward_zero_std",
    "clip/frac",
    "grad_norm",
    "lr",
    "time/step",
    "time/generate",
    "time/score",
    "time/update",
    "tokens/s",
}


def tiny_args(model_dir, out, steps=2, *extra):
    return [
        "train",
        "--model",
        str(model_dir),
        "--output-dir",
        str(out),
        "-o",
        f"train.steps={steps}",
        "-o",
        "rollout.max_new_tokens=8",
        "-o",
        "rollout.group_size=4",
        "-o",
        "rollout.prompts_per_step=2",
        "-o",
        "train.micro_batch_size=3",
        "-o",
        "verifier.workers=1",
        "-o",
        "data.arith.train_size=100",
        "-o",
        "data.arith.test_size=20",
        "-o",
        "train.lr=0.05",
        "-o",
        "verifier.grader=helpers:length_reward",
        "-o",
        "data.arith.min_value=1",
        "-o",
        "data.arith.max_value=40",
        *extra,
    ]


def invoke(args):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_two_steps_write_the_run_directory_and_eval_reads_it(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    invoke(tiny_args(tiny_model_dir, out))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert STEP_FIELDS <= set(metrics[0]), STEP_FIELDS - set(metrics[0])
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 2 * 2 * 4 and {"prompt", "completion", "reward", "advantage"} <= set(rollouts[0])
    assert (out / "config.yaml").is_file() and (out / "checkpoints" / "step-2" / "COMPLETE").is_file()
    assert (out / "checkpoints" / "step-2" / "adapter" / "adapter_model.safetensors").is_file()
    invoke(["eval", "--model", str(out), "--limit", "5", "--max-new-tokens", "4"])
    summary = json.loads((out / "eval" / "step-2" / "arith" / "summary.json").read_text())  # the checkpoint's own directory
    assert summary["problems"] == 5 and "avg@1" in summary["metrics"]
    assert summary["settings"]["checkpoint_step"] == 2 and summary["settings"]["checkpoint"].endswith("step-2")
    assert len(read_jsonl(out / "eval" / "step-2" / "arith" / "samples.jsonl")) == 5


def test_eval_after_more_training_evaluates_the_new_checkpoint(tiny_model_dir, tmp_path):
    """train, eval, train more, eval again: new samples of the new checkpoint, never the old ones re-served;
    an --output holding another checkpoint's samples is refused."""
    out, fixed = tmp_path / "run", tmp_path / "fixed-output"
    invoke(tiny_args(tiny_model_dir, out, 2))
    args = ["eval", "--model", str(out), "--limit", "4", "--max-new-tokens", "6", "--temperature", "1.0"]
    invoke(args)
    invoke([*args, "--output", str(fixed)])
    invoke(["train", "--resume", str(out), "-o", "train.steps=4"])
    invoke(args)
    first = read_jsonl(out / "eval" / "step-2" / "arith" / "samples.jsonl")
    second = read_jsonl(out / "eval" / "step-4" / "arith" / "samples.jsonl")
    assert [r["completion"] for r in first] != [r["completion"] for r in second]
    result = CliRunner().invoke(app, [*args, "--output", str(fixed)])
    assert isinstance(result.exception, UserError) and "checkpoint" in str(result.exception), result.output


def test_resume_gives_the_same_steps_as_an_uninterrupted_run(tiny_model_dir, tmp_path):
    keys = ["reward/mean", "loss", "entropy", "grad_norm", "length/mean"]
    invoke(tiny_args(tiny_model_dir, tmp_path / "straight", 4))
    invoke(tiny_args(tiny_model_dir, tmp_path / "split", 2))
    invoke(["train", "--resume", str(tmp_path / "split"), "-o", "train.steps=4"])
    straight = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "straight" / "metrics.jsonl")]
    split = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "split" / "metrics.jsonl")]
    assert len(straight) == 4 and split == straight
    # not vacuous: the policy received gradient and the rewards differ between steps
    assert all(m["grad_norm"] > 0 for m in straight) and len({m["reward/mean"] for m in straight}) > 1


def test_full_fine_tuning_and_plain_template(tiny_plain_model_dir, tmp_path):
    out = tmp_path / "full"
    result = invoke(tiny_args(tiny_plain_model_dir, out, 1, "-o", "model.lora.rank=0", "-o", "train.lr=1e-3"))
    assert (out / "checkpoints" / "step-1" / "model" / "model.safetensors").is_file()
    notes = [line for line in result.output.splitlines() if "no chat template" in line]  # prompt.template=auto fell back
    assert len(notes) == 1 and "prompt.template=plain or prompt.template=chat" in notes[0]
    assert json.loads((out / "data_report.json").read_text())["template"] == "plain"
    invoke(["eval", "--model", str(out), "--limit", "3", "--max-new-tokens", "4"])


def test_bad_rows_are_skipped_and_reported(tiny_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    good = [json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(6)]
    data.write_text("\n".join(good + ['{"problem": "no answer"}', "not json"]) + "\n")
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 1, "--dataset", str(data)))
    report = json.loads((out / "data_report.json").read_text())
    assert report["used"] == 6 and report["skipped"] == {"unreadable row": 1, "missing answer": 1}
    assert report["skipped_where"] == {"unreadable row": f"{data}, line 8", "missing answer": f"{data}, line 7"}
    assert report["template"] == "chat" and "no chat template" not in result.output


def test_a_prompt_the_budget_does_not_fit_beside_is_skipped_counted_and_warned_about(tiny_model_dir, tmp_path):
    """The tiny model's context is 512 tokens (one per character): with rollout.max_new_tokens=200 a prompt of
    about 460 tokens is under data.max_prompt_tokens=512 but leaves no room for the budget, so it is skipped,
    counted in data_report.json and on the data: line, and a warning says the prompt limit is clipped to 312."""
    data = tmp_path / "d.jsonl"
    rows = [{"id": f"p{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    data.write_text("\n".join(json.dumps(r) for r in [*rows, {"id": "long", "problem": "9" * 420, "answer": "9"}]) + "\n")
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 1, "--dataset", str(data), "-o", "rollout.max_new_tokens=200"))
    report = json.loads((out / "data_report.json").read_text())
    assert report["used"] == 3 and report["skipped"] == {"prompt + max_new_tokens over the context": 1}
    assert report["context_window"] == 512
    assert "skipped: 1 prompt + max_new_tokens over the context" in result.output
    assert "data.max_prompt_tokens=512 + rollout.max_new_tokens=200 is past the 512-token context" in result.output
    assert "prompts are limited to 312 tokens" in result.output


def run_cli(*args):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "thinkrl", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--method", "nosuch"], "error: unknown method 'nosuch'; available: "),
        (["train", "-o", "train.lrr=1"], "error: unknown config key 'train.lrr' (did you mean train.lr?)"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.strip().startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_methods_lists_names_with_one_line_each():
    result = run_cli("methods")
    assert result.returncode == 0
    assert any(line.startswith("grpo ") for line in result.stdout.splitlines())
    detail = run_cli("methods", "grpo")
    assert "arXiv 2402.03300" in detail.stdout and "clip_high = 0.2" in detail.stdout


def test_periodic_eval_during_training(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    invoke(tiny_args(tiny_model_dir, out, 2, "-o", "eval.every=1", "-o", "eval.limit=3"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all("eval/arith/avg@1" in m and "time/eval" in m for m in metrics)
    for step in (1, 2):
        summary = json.loads((out / "eval" / f"step-{step}" / "arith" / "summary.json").read_text())
        assert summary["problems"] == 3 and summary["settings"]["preset"] == "train"
        assert summary["settings"]["grader"] == "helpers:length_reward"  # the run's own grader
