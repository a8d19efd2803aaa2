"""`thinkrl eval` on the tiny model: presets, outputs, resume without regeneration, settings checks."""

import hashlib
import json

import pytest
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.evaluation.settings import EvalSettings, resolve_settings
from thinkrl.rollout.engines import LeanEngine
from thinkrl.run.jsonl import read_jsonl

SAMPLE_FIELDS = {"id", "sample", "completion", "extracted", "gold", "correct", "length", "truncated"}
SETTING_FIELDS = {
    "model",
    "adapter",
    "dataset",
    "preset",
    "n",
    "temperature",
    "top_p",
    "max_new_tokens",
    "seed",
    "template",
    "system",
    "instruction",
    "dtype",
    "grader",
    "context_window",
}


@pytest.fixture
def aime_like(tmp_path):
    path = tmp_path / "aime_like.jsonl"
    rows = [{"id": f"p{i}", "problem": f"Find {i} + {i}.", "answer": f"{2 * i:03d}"} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def invoke(*args):
    result = CliRunner().invoke(app, ["eval", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.plain
def test_eval_writes_samples_and_summary_and_resumes_without_generating(tiny_model_dir, aime_like, tmp_path, monkeypatch):
    out = tmp_path / "out"
    args = [
        "--model",
        str(tiny_model_dir),
        "--dataset",
        str(aime_like),
        "--n",
        "2",
        "--limit",
        "3",
        "--max-new-tokens",
        "6",
        "--temperature",
        "1.0",
        "--output",
        str(out),
    ]
    invoke(*args)
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 6 and SAMPLE_FIELDS <= set(samples[0])
    assert samples[0]["gold"] == "000"  # gold kept as written; graded as the integer 0
    summary = json.loads((out / "summary.json").read_text())
    assert {"avg@2", "pass@1", "pass@2", "maj@2", "length/mean", "truncated_frac", "avg@2_ci95_low"} <= set(summary["metrics"])
    assert SETTING_FIELDS <= set(summary["settings"]), SETTING_FIELDS - set(summary["settings"])
    assert {"torch", "transformers", "math-verify"} <= set(summary["versions"])
    assert summary["settings"]["preset"] == "greedy" and summary["settings"]["n"] == 2

    calls = []
    real = LeanEngine.generate
    monkeypatch.setattr(LeanEngine, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    invoke(*args)
    assert calls == [] and read_jsonl(out / "samples.jsonl") == samples  # nothing regenerated
    invoke(*[a if a != "3" else "5" for a in args])  # a larger --limit generates only the new problems
    assert len(calls) == 1 and len(read_jsonl(out / "samples.jsonl")) == 10


@pytest.mark.plain
def test_resume_with_other_settings_is_refused(tiny_model_dir, aime_like, tmp_path):
    out = tmp_path / "out"
    base = ["--model", str(tiny_model_dir), "--dataset", str(aime_like), "--limit", "2", "--max-new-tokens", "4", "--output", str(out)]
    invoke(*base)
    with pytest.raises(UserError, match="temperature"):
        CliRunner().invoke(app, ["eval", *base, "--temperature", "0.7"], catch_exceptions=False)


@pytest.mark.plain
def test_several_datasets_get_one_directory_each(tiny_model_dir, aime_like, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        "--model",
        str(tiny_model_dir),
        "--dataset",
        f"{aime_like},arith",
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "--output",
        str(out),
        "--json",
    )
    assert (out / "aime_like" / "summary.json").is_file() and (out / "arith" / "summary.json").is_file()
    assert [s["dataset"] for s in json.loads(result.stdout)] == [str(aime_like), "arith"]


def test_presets_and_flag_overrides():
    cfg = Config()
    greedy = resolve_settings(EvalSettings(model="m", dataset="aime24"), cfg)
    assert (greedy.preset, greedy.n, greedy.temperature, greedy.max_new_tokens) == ("greedy", 1, 0.0, 3000)
    assert "boxed" in greedy.system
    reasoning = resolve_settings(EvalSettings(model="m", dataset="aime24", preset="reasoning", n=32), cfg)
    assert (reasoning.n, reasoning.temperature, reasoning.top_p) == (32, 0.6, 0.95) and reasoning.system is None
    own = resolve_settings(EvalSettings(model="m", dataset=""), cfg)
    assert own.preset == "train" and own.dataset == "arith" and own.max_new_tokens == cfg.rollout.max_new_tokens
    assert resolve_settings(EvalSettings(model="m", dataset="x", system="none"), cfg).system is None
    with pytest.raises(UserError, match="unknown --preset"):
        resolve_settings(EvalSettings(model="m", dataset="x", preset="fast"), cfg)


@pytest.mark.plain
def test_context_window_clips_the_budget_with_a_warning(tiny_model_dir, aime_like, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        "--model", str(tiny_model_dir), "--dataset", str(aime_like), "--limit", "1", "--max-new-tokens", "100000", "--output", str(out)
    )
    assert "clipped" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["clipped_prompts"] == 1 and summary["settings"]["context_window"] == 512


@pytest.mark.plain
def test_only_the_prompt_that_needs_it_is_clipped_and_one_past_the_context_is_skipped(tiny_model_dir, tmp_path):
    """The tiny model's context is 512 tokens (one per character here): a 488-token prompt gets the 24 that are
    left, the short ones their whole budget, and a 600-token prompt is skipped and counted, not fatal."""
    data = tmp_path / "mixed.jsonl"
    rows = [{"id": "short", "problem": "1 + 1?", "answer": "2"}, {"id": "long", "problem": "9" * 470, "answer": "9"}]
    rows.append({"id": "huge", "problem": "8" * 600, "answer": "8"})
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    invoke(
        "--model",
        str(tiny_model_dir),
        "--dataset",
        str(data),
        "--max-new-tokens",
        "40",
        "--output",
        str(out),
        "--template",
        "plain",
        "--system",
        "none",
    )
    samples = {r["id"]: r for r in read_jsonl(out / "samples.jsonl")}
    summary = json.loads((out / "summary.json").read_text())
    assert set(samples) == {"short", "long"} and summary["skipped"] == {"prompt fills the context": 1}
    assert summary["settings"]["clipped_prompts"] == 1
    assert samples["long"]["length"] < 40 and samples["long"]["truncated"]  # its own room only
    assert samples["short"]["length"] == 40 or not samples["short"]["truncated"]  # the whole budget


@pytest.mark.plain
def test_local_alias_copies_via_thinkrl_data_dir(tiny_model_dir, tmp_path, monkeypatch):
    (tmp_path / "aime24.jsonl").write_text(json.dumps({"id": "x", "problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    monkeypatch.setenv("THINKRL_DATA_DIR", str(tmp_path))
    out = tmp_path / "out"
    invoke("--model", str(tiny_model_dir), "--dataset", "aime24", "--max-new-tokens", "4", "--output", str(out))
    assert json.loads((out / "summary.json").read_text())["problems"] == 1


@pytest.mark.plain
def test_a_shipped_benchmark_needs_no_hub_and_is_recorded_by_file_and_hash(tiny_model_dir, tmp_path, monkeypatch):
    from thinkrl.data import sources
    from thinkrl.data.benchmarks import HERE

    for key in ("THINKRL_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sources, "read_hub", lambda *a, **k: pytest.fail("asked the hub for aime24"))
    out = tmp_path / "out"
    result = invoke("--model", str(tiny_model_dir), "--dataset", "aime24", "--limit", "2", "--max-new-tokens", "4", "--output", str(out))
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["dataset"], settings["dataset_source"]) == ("aime24", "package:aime24") and "its numbers" not in result.output
    assert settings["dataset_sha256"] == hashlib.sha256((HERE / "aime24.jsonl").read_bytes()).hexdigest()
    assert json.loads((out / "summary.json").read_text())["settings"]["dataset_sha256"] == settings["dataset_sha256"]


@pytest.mark.plain
def test_a_data_dir_copy_with_another_row_count_than_the_benchmark_warns_in_one_line(tiny_model_dir, tmp_path, monkeypatch):
    copy = tmp_path / "aime24.jsonl"
    copy.write_text("".join(json.dumps({"id": f"x{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(2)))
    monkeypatch.setenv("THINKRL_DATA_DIR", str(tmp_path))
    out = tmp_path / "out"
    result = invoke("--model", str(tiny_model_dir), "--dataset", "aime24", "--max-new-tokens", "4", "--output", str(out))
    lines = [line for line in result.output.splitlines() if "aime24 has 30 problems" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: aime24: ") and f"{copy} has 2 rows" in lines[0], result.output
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["dataset"], settings["dataset_source"]) == ("aime24", str(copy.resolve()))
    assert settings["dataset_sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()


@pytest.mark.plain
def test_resume_with_a_changed_dataset_file_is_refused(tiny_model_dir, aime_like, tmp_path):
    out = tmp_path / "out"
    base = ["--model", str(tiny_model_dir), "--dataset", str(aime_like), "--limit", "2", "--max-new-tokens", "4", "--output", str(out)]
    invoke(*base)
    aime_like.write_text(aime_like.read_text().replace('"answer": "002"', '"answer": "3"'))  # same name, other data
    with pytest.raises(UserError, match=r"holds samples of .*aime_like.jsonl \(sha256 [0-9a-f]{12}\), but .* now reads .*other data"):
        CliRunner().invoke(app, ["eval", *base], catch_exceptions=False)
