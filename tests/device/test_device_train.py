"""`thinkrl train` for one step with Accelerate's device set to the fake one (ACCELERATE_TORCH_DEVICE, Accelerate's
own setting): setup, the rollout on the device (transformers, as on a GPU without vLLM), grading, the update, the
metrics and the checkpoint, the whole loop as a GPU runs it. (The update's and the rollout's numbers are compared
with the CPU's in test_device_update.py and test_device_rollout.py.)"""

from __future__ import annotations

import math

import pytest
from accelerate.state import AcceleratorState
from test_cli_e2e import invoke, tiny_args

from thinkrl import distributed
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.device


@pytest.fixture
def accelerate_state(monkeypatch):
    """Accelerate's state is one per process: built afresh for the test, and dropped after it."""
    monkeypatch.setattr(distributed, "_device", distributed._device)  # the run sets it; restored after the test
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def one_step(model_dir, out) -> dict:
    result = invoke(tiny_args(model_dir, out, 1, "-o", "rollout.engine=transformers"))  # auto's choice on a GPU without vLLM
    AcceleratorState._reset_state(reset_partial_state=True)
    assert (out / "checkpoints" / "step-1" / "COMPLETE").is_file()
    return {"output": result.output, **read_jsonl(out / "metrics.jsonl")[0]}


def test_one_training_step_on_the_device(tiny_model_dir, tmp_path, fakegpu, accelerate_state, monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", str(fakegpu))
    step = one_step(tiny_model_dir, tmp_path / "run")
    assert "on fakegpu:0 in float32" in step["output"] and "sampling: engine transformers" in step["output"], step["output"]
    assert step["update/optimizer_steps"] == 1 and step["update/skipped_nonfinite"] == 0
    assert all(math.isfinite(step[k]) for k in ("reward/mean", "loss", "grad_norm", "entropy")), step
    assert step["grad_norm"] > 0
