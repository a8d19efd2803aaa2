"""Several processes (torchrun, gloo on CPU) train exactly as one process over the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from launch import ranks, thinkrl_script, torchrun_cmd

from thinkrl.run.jsonl import read_jsonl

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo")


def torchrun(n: int, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return ranks([*torchrun_cmd(n), *args], cwd=cwd)


@pytest.mark.parametrize(
    ("method", "overrides"),
    [
        ("grpo", []),  # token-mean over the global batch: ranks hold 32 and 55 tokens
        ("grpo", ["-o", "train.micro_batch_size=1"]),  # rank 0 runs 6 micro-batches, rank 1 6 with other lengths
        ("dr_grpo", ["-o", "train.micro_batch_tokens=12"]),  # sequence-level normalisation, uneven micro-batch counts
        ("gspo", []),  # sequence-level ratio; its recipe: 4 mini-batches, each the same completions at any process count
    ],
)
@pytest.mark.plain
def test_two_process_update_equals_one_process_update(tiny_model_dir, tmp_path, method, overrides):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    single = subprocess.run(
        [sys.executable, str(HERE / "dist_update.py"), str(tiny_model_dir), str(one), method, *overrides],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert single.returncode == 0, single.stderr[-3000:]
    torchrun(2, str(HERE / "dist_update.py"), str(tiny_model_dir), str(two), method, *overrides)
    a, b = torch.load(one), torch.load(two)
    assert a["world"] == 1 and b["world"] == 2
    assert a["delta"].keys() == b["delta"].keys()
    for name, delta in a["delta"].items():
        assert delta.abs().max() > 0, name  # every adapter matrix moved
        torch.testing.assert_close(b["delta"][name], delta, rtol=1e-4, atol=1e-7, msg=name)
    for key in ("loss", "entropy", "grad_norm"):
        assert b["metrics"][key] == pytest.approx(a["metrics"][key], rel=1e-4, abs=1e-7), key


@pytest.mark.plain
def test_torchrun_train_writes_one_log_and_one_checkpoint(tiny_model_dir, tmp_path):
    """`torchrun --nproc_per_node 2 thinkrl train`: groups are split across ranks, rank 0 writes everything."""
    out = tmp_path / "run"
    script = thinkrl_script()
    args = [
        "train",
        "--model",
        str(tiny_model_dir),
        "-O",
        str(out),
        "-o",
        "train.steps=2",
        "-o",
        "rollout.prompts_per_step=4",
        "-o",
        "rollout.group_size=2",
        "-o",
        "rollout.max_new_tokens=6",
        "-o",
        "verifier.workers=1",
        "-o",
        "train.save_every=1",
    ]
    torchrun(2, *script, *args)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]  # one line per step, not one per rank
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 2 * 4 * 2  # every rank's completions, gathered
    for step in (1, 2):
        ids = [r["prompt_id"] for r in rollouts if r["step"] == step]
        assert len(set(ids)) == 4 and all(ids.count(i) == 2 for i in set(ids))  # whole groups
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert json.loads((out / "checkpoints" / "step-2" / "trainer_state.json").read_text())["step"] == 2


def test_prompts_per_step_must_divide_by_the_process_count(tiny_model_dir, tmp_path):
    entry = Path(sys.executable).with_name("thinkrl")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(entry),
        "train",
        "--model",
        str(tiny_model_dir),
        "-O",
        str(tmp_path / "run"),
        "-o",
        "rollout.prompts_per_step=3",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode != 0
    assert "rollout.prompts_per_step=3 must be a multiple of the 2 processes" in proc.stderr


def test_shutdown_closes_the_process_group_and_is_a_no_op_without_one(tmp_path):
    from thinkrl import distributed

    distributed.shutdown()  # nothing initialised: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.is_initialized()
        distributed.shutdown()
        assert not dist.is_initialized()
        distributed.shutdown()  # twice is harmless (train.py calls it in a finally)
    finally:  # a failure must not leave this pytest process in a process group for later tests
        if dist.is_initialized():
            dist.destroy_process_group()
