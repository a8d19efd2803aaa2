"""The path a GPU runs, on a CPU: bfloat16 weights and none of the CPU speed-ups (THINKRL_ACCEL=0), through
`thinkrl train` and `thinkrl eval` on the tiny model.

On CUDA model.dtype auto is bfloat16 and thinkrl/accel steps aside; the rest of the suite runs float32 with the
speed-ups on (or off, in `make test-plain`), so without this file nothing on a CPU trains, samples, saves, merges
and evaluates bfloat16 weights. THINKRL_ACCEL is read at each call (thinkrl/accel/switch.py), so setting it
for the test reaches every hook. Eval has no dtype setting: its auto is bfloat16 only on CUDA, which the eval
test stands in for by resolving auto as a GPU does.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_cli_e2e import invoke, tiny_args

from thinkrl.evaluation import evaluate
from thinkrl.models import resolve_dtype
from thinkrl.run.jsonl import read_jsonl


@pytest.fixture(scope="module")
def bf16_run(tiny_model_dir, tmp_path_factory):
    """Two LoRA steps in bfloat16 with the speed-ups off, and the run's output."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THINKRL_ACCEL", "0")
        out = tmp_path_factory.mktemp("bf16") / "run"
        result = invoke(tiny_args(tiny_model_dir, out, 2, "-o", "model.dtype=bfloat16"))
    return out, result.output


def test_training_in_bfloat16_with_the_speedups_off(bf16_run):
    out, output = bf16_run
    # the frozen base weights are bfloat16; peft keeps the LoRA adapters it trains (the masters) in float32
    assert "on cpu in float32 masters, bfloat16 compute, bfloat16 frozen base" in output, output
    assert "sampling: engine lean (auto on a CPU): fused decoder" in output, output
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in metrics), metrics
    assert all(m["update/skipped_nonfinite"] == 0 for m in metrics)
    assert all(m["mismatch/abs_log_ratio"] < 0.01 for m in metrics), metrics  # the bfloat16 sampler's log-probs are the trainer's
    assert (out / "checkpoints" / "step-2" / "COMPLETE").is_file()


def test_eval_of_the_bfloat16_run_as_a_gpu_loads_it(bf16_run, monkeypatch):
    """eval merges the float32 adapters into the bfloat16 base and samples with it, as auto does on CUDA."""
    out, _ = bf16_run
    monkeypatch.setenv("THINKRL_ACCEL", "0")
    monkeypatch.setattr(
        evaluate, "resolve_dtype", lambda dtype, device: torch.bfloat16 if dtype == "auto" else resolve_dtype(dtype, device)
    )
    loaded = []
    load = evaluate.load_for_eval
    monkeypatch.setattr(evaluate, "load_for_eval", lambda *a: loaded.append(load(*a)) or loaded[-1])
    result = invoke(["eval", "--model", str(out), "--limit", "4", "--max-new-tokens", "4"])
    assert {p.dtype for p in loaded[0][0].parameters()} == {torch.bfloat16}
    assert "sampling: engine lean (auto on a CPU): fused decoder" in result.output, result.output
    summary = json.loads((out / "eval" / "step-2" / "arith" / "summary.json").read_text())
    assert summary["problems"] == 4 and summary["settings"]["checkpoint_step"] == 2
    samples = read_jsonl(out / "eval" / "step-2" / "arith" / "samples.jsonl")
    assert len(samples) == 4 and all(isinstance(s["completion"], str) for s in samples)


@pytest.mark.parametrize("masters,said,saved", [("float32", "float32 masters, bfloat16 compute,", "F32"), ("same", "bfloat16,", "BF16")])
def test_full_fine_tuning_saves_its_master_weights(tiny_model_dir, tmp_path, monkeypatch, masters, said, saved):
    """lora.rank=0 computing in bfloat16: the checkpoint keeps the weights as trained, float32 masters by default,
    bfloat16 with model.master_dtype=same."""
    from safetensors import safe_open

    monkeypatch.setenv("THINKRL_ACCEL", "0")
    out = tmp_path / "run"
    overrides = ("model.dtype=bfloat16", "model.lora.rank=0", "train.lr=1e-3", f"model.master_dtype={masters}")
    result = invoke(tiny_args(tiny_model_dir, out, 1, *(x for o in overrides for x in ("-o", o))))
    assert f"on cpu in {said}" in result.output, result.output
    assert math.isfinite(read_jsonl(out / "metrics.jsonl")[0]["loss"])
    with safe_open(str(out / "checkpoints" / "step-1" / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {saved}
