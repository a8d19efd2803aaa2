"""End to end on the bundled SmolLM2-135M-Instruct (slow: 5-60 s a test on 2 CPU cores)."""

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


# Every method trains on the tiny model in the fast suite (tests/test_every_method.py); here, on the bundled model's
# 49k-token vocabulary, the methods whose inputs are computed over the whole vocabulary: sis (the proposal's top-K
# log-probs), ict (a divergence per token), stare (the old policy's entropy, as entropy_fork and stapo read it).
# grpo trains here in test_readme_runs.py and thinking_seeds below.
@pytest.mark.parametrize("method", ["sis", "ict", "stare"])
def test_methods_with_vocabulary_wide_inputs_train_two_steps(method, tmp_path):
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
    """Also the bundled model's resume check: a run stopped at step 3 and resumed to 6 is the uninterrupted run."""
    opts = ["--method", "thinking_seeds", "-o", "seeds.every=2", *SMALL]
    keys = ["reward/mean", "loss", "grad_norm", "entropy", "length/mean", "seeds/pool_size", "seeds/seeded_frac", "prefix/abs_log_ratio"]
    invoke(["train", "-o", "train.steps=6", "--output-dir", str(tmp_path / "a"), *opts])
    invoke(["train", "-o", "train.steps=3", "--output-dir", str(tmp_path / "b"), *opts])
    invoke(["train", "--resume", str(tmp_path / "b"), "-o", "train.steps=6"])
    a = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    b = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert len(a) == 6 and a == b  # the weights, the optimizer, the RNG and the pool came back with the checkpoint
    assert [m["seeds/pool_size"] for m in a] == [1, 1, 2, 2, 3, 3]
    rows = read_jsonl(tmp_path / "a" / "rollouts.jsonl")
    seeded = [r for r in rows if r["prefix_len"] > 0]
    assert seeded and all(r["step"] >= 2 and 0 <= r["seed_step"] < r["step"] for r in seeded)
