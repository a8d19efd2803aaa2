"""Trackers, plot, compare, show and export on tiny-model runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_cli_e2e import invoke, tiny_args
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl
from thinkrl.run.plot import smooth
from thinkrl.run.readers import compare_rows, load_runs


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir, tmp_path_factory):
    """A grpo run (with TensorBoard) and a dapo run, 3 steps each."""
    root = tmp_path_factory.mktemp("runs")
    invoke(tiny_args(tiny_model_dir, root / "grpo", 3, "-o", "log.trackers=[tensorboard]"))
    invoke(tiny_args(tiny_model_dir, root / "dapo", 3, "--method", "dapo"))
    return root / "grpo", root / "dapo"


@pytest.mark.plain
def test_tensorboard_event_file_holds_the_metrics_jsonl_values(two_runs):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = two_runs[0]
    files = list((run / "trackers").rglob("events.out.tfevents.*"))
    assert files, list((run / "trackers").rglob("*"))
    events = EventAccumulator(str(files[0].parent)).Reload()
    metrics = read_jsonl(run / "metrics.jsonl")
    for key in ("reward/mean", "loss", "length/mean"):
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [1, 2, 3]
        assert [s.value for s in scalars] == pytest.approx([m[key] for m in metrics], rel=1e-6)


def test_unknown_or_missing_tracker_is_a_clear_error(tiny_model_dir, tmp_path):
    result = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path / "r", 1, "-o", "log.trackers=[tensorbored]"))
    assert result.exit_code != 0 and "unknown tracker 'tensorbored'" in str(result.exception)


def test_plot_writes_a_png_with_a_line_per_run(two_runs, tmp_path):
    out = tmp_path / "fig.png"
    result = CliRunner().invoke(app, ["plot", *map(str, two_runs), "--out", str(out), "--smooth", "2"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_names_a_bad_output_format(two_runs, tmp_path):
    result = CliRunner().invoke(app, ["plot", str(two_runs[0]), "--out", str(tmp_path / "fig.txt")])
    assert result.exit_code != 0 and "end the name in .png" in str(result.exception)


def test_smoothing_is_a_trailing_moving_average():
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert smooth([1.0, 3.0], 1) == [1.0, 3.0]


def test_compare_table_has_final_and_best_per_run(two_runs):
    runs = load_runs(list(two_runs))
    header, rows = compare_rows(runs, tail=2)
    assert header == ["", "grpo", "dapo"] and rows[0] == ["steps", "3", "3"]
    table = {row[0]: row[1:] for row in rows}
    rewards = [m["reward/mean"] for m in read_jsonl(two_runs[0] / "metrics.jsonl")]
    assert float(table["reward final"][0]) == pytest.approx(sum(rewards[-2:]) / 2, abs=1e-3)
    best = max(rewards)
    assert table["reward best (step)"][0] == f"{best:.3f} ({rewards.index(best) + 1})"
    assert "clip frac max (step)" in table
    result = CliRunner().invoke(app, ["compare", *map(str, two_runs)])
    assert result.exit_code == 0, result.output


def test_compare_rejects_a_directory_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(app, ["compare", str(tmp_path)])
    assert result.exit_code != 0 and "not a thinkrl run directory" in str(result.exception)


def test_show_prints_a_steps_completions_with_rewards_and_advantages(two_runs):
    run = two_runs[0]
    result = CliRunner().invoke(app, ["show", str(run), "--step", "2", "--groups", "0"])
    assert result.exit_code == 0, result.output
    rows = [r for r in read_jsonl(run / "rollouts.jsonl") if r["step"] == 2]
    assert "step 2: 2 groups" in result.output
    assert result.output.count("advantage") == len(rows)
    assert f"advantage {rows[0]['advantage']:+.2f}" in result.output
    bad = CliRunner().invoke(app, ["show", str(run), "--step", "9"])
    assert bad.exit_code != 0 and "logged steps: 1-3" in str(bad.exception)


@pytest.mark.parametrize("merge", [False, True])
def test_export_loads_in_transformers_and_matches_the_runs_policy(two_runs, tmp_path, merge):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from thinkrl.settings import load_config

    run, out = two_runs[0], tmp_path / "export"
    result = CliRunner().invoke(app, ["export", str(run), "--out", str(out), *(["--merge"] if merge else [])])
    assert result.exit_code == 0, result.output
    base_name = load_config(run / "config.yaml").model.name
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_name), run / "checkpoints" / "step-3" / "adapter")
    if merge:
        exported = AutoModelForCausalLM.from_pretrained(out)
        assert not (out / "adapter_config.json").exists()
    else:
        exported = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_name), out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template  # chat-formatted prompts work from the export alone
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        a = torch.log_softmax(reference(input_ids=ids).logits, -1)
        b = torch.log_softmax(exported(input_ids=ids).logits, -1)
        with reference.disable_adapter():
            base = torch.log_softmax(reference(input_ids=ids).logits, -1)
        assert (a - base).abs().max() > 1e-5  # the adapter was trained, so matching it is not trivial
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
        greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        assert torch.equal(exported.generate(ids, **greedy), reference.generate(input_ids=ids, **greedy))


@pytest.mark.parametrize("out", ["file", "file/sub"])
def test_export_to_a_file_is_one_line_naming_it(two_runs, tmp_path, out):
    (tmp_path / "file").write_text("keep me")
    result = CliRunner().invoke(app, ["export", str(two_runs[0]), "--out", str(tmp_path / out)])
    assert isinstance(result.exception, UserError), result.exception  # the CLI prints it as one line, exit 2
    where = "it" if out == "file" else tmp_path / "file"
    fix = "name a new directory (the export writes several files into it)"
    assert str(result.exception) == f"--out {tmp_path / out}: {where} is a file; {fix}"
    assert (tmp_path / "file").read_text() == "keep me"


@pytest.mark.plain
def test_an_export_of_the_bundled_alias_names_its_hub_id(tiny_model_dir, tmp_path, monkeypatch):
    """A run on smollm2-135m trains from a converted copy in the cache; its adapter names the hub id, which loads anywhere."""
    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path / "cache"))
    shutil.copytree(tiny_model_dir, tmp_path / "cache" / "models" / "smollm2-135m")  # stands in for the converted GGUF
    invoke(tiny_args("smollm2-135m", tmp_path / "run", 1))
    trained = json.loads((tmp_path / "run" / "checkpoints" / "step-1" / "adapter" / "adapter_config.json").read_text())
    assert trained["base_model_name_or_path"] == str(tmp_path / "cache" / "models" / "smollm2-135m")  # what peft recorded
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    exported = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert exported == {**trained, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def test_show_refuses_negative_counts(tmp_path):
    for flag in ("--groups", "--max-chars"):
        result = CliRunner().invoke(app, ["show", str(tmp_path), flag, "-1"])
        assert isinstance(result.exception, UserError) and str(result.exception).startswith(f"{flag} must be >= 0 (0 = "), result.output


def test_export_refuses_a_non_empty_target(two_runs, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "file").write_text("keep me")
    result = CliRunner().invoke(app, ["export", str(two_runs[0]), "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "not empty" in str(result.exception)
