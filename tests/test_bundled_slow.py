"""End to end on the bundled SmolLM2-135M-Instruct (slow: about a minute per run on 2 CPU cores)."""

import json

import pytest
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.slow

SMALL = ["-o", "rollout.max_new_tokens=16", "-o", "rollout.group_size=4", "-o", "verifier.workers=1"]


def invoke(args):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_train_two_steps_then_eval_the_run(tmp_path):
    out = tmp_path / "run"
    invoke(["train", "--method", "grpo", "-o", "train.steps=2", "--output-dir", str(out), *SMALL])
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["length/mean"] > 0 and m["time/generate"] > 0 for m in metrics)
    assert (out / "config.yaml").is_file() and read_jsonl(out / "rollouts.jsonl")
    invoke(["eval", "--model", str(out), "--limit", "4", "--max-new-tokens", "16"])
    summary = json.loads((out / "eval" / "step-2" / "arith" / "summary.json").read_text())  # RUN_DIR/eval/step-N/<dataset>
    assert summary["problems"] == 4 and summary["settings"]["checkpoint_step"] == 2


def test_resume_matches_an_uninterrupted_run(tmp_path):
    keys = ["reward/mean", "loss", "grad_norm", "entropy", "length/mean"]
    invoke(["train", "-o", "train.steps=4", "--output-dir", str(tmp_path / "a"), *SMALL])
    invoke(["train", "-o", "train.steps=2", "--output-dir", str(tmp_path / "b"), *SMALL])
    invoke(["train", "--resume", str(tmp_path / "b"), "-o", "train.steps=4"])
    a = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    b = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert len(a) == 4 and a == b


def builtin_methods() -> list[str]:
    """Methods shipped in thinkrl/methods (not plugins another test may have loaded)."""
    from pathlib import Path

    import thinkrl.methods as m

    return [n for n in m.available_methods() if Path(m.method_source(n)).parent == Path(m.__file__).parent]


@pytest.mark.parametrize("method", builtin_methods())
def test_every_method_trains_two_steps(method, tmp_path):
    out = tmp_path / method
    invoke(["train", "--method", method, "-o", "train.steps=2", "--output-dir", str(out), *SMALL])
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # finite, or (dynamic sampling kept no group: the untrained model rarely has a reward spread) not measured
        empty = m.get("sampling/kept_groups") == 0
        assert m["loss"] == "nan" if empty else (isinstance(m["loss"], float) and abs(m["loss"]) < 1e6), m


def test_fp8_rollouts_show_a_mismatch_that_same_precision_does_not(tmp_path):
    invoke(["train", "-o", "train.steps=2", "-o", "rollout.precision=fp8", "--output-dir", str(tmp_path / "fp8"), *SMALL])
    invoke(["train", "-o", "train.steps=2", "-o", "rollout.precision=same", "--output-dir", str(tmp_path / "same"), *SMALL])
    fp8 = read_jsonl(tmp_path / "fp8" / "metrics.jsonl")
    same = read_jsonl(tmp_path / "same" / "metrics.jsonl")
    assert all(m["mismatch/abs_log_ratio"] > 1e-3 and m["mismatch/k3"] > 1e-5 for m in fp8)
    assert all(m["mismatch/abs_log_ratio"] < 1e-4 for m in same)  # float rounding of the merged LoRA copy only


def test_thinking_seeds_fills_its_pool_seeds_rollouts_and_resumes(tmp_path):
    opts = ["--method", "thinking_seeds", "-o", "seeds.every=2", *SMALL]
    keys = ["reward/mean", "loss", "seeds/pool_size", "seeds/seeded_frac", "prefix/abs_log_ratio"]
    invoke(["train", "-o", "train.steps=6", "--output-dir", str(tmp_path / "a"), *opts])
    invoke(["train", "-o", "train.steps=3", "--output-dir", str(tmp_path / "b"), *opts])
    invoke(["train", "--resume", str(tmp_path / "b"), "-o", "train.steps=6"])
    a = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    b = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert a == b  # the pool came back with the checkpoint
    assert [m["seeds/pool_size"] for m in a] == [1, 1, 2, 2, 3, 3]
    rows = read_jsonl(tmp_path / "a" / "rollouts.jsonl")
    seeded = [r for r in rows if r["prefix_len"] > 0]
    assert seeded and all(r["step"] >= 2 and 0 <= r["seed_step"] < r["step"] for r in seeded)
