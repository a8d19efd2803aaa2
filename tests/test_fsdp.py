"""FSDP2 through Accelerate (configs/accelerate/fsdp.yaml as shipped), two processes on the CPU over gloo.

Sharded parameters, gradients and AdamW state give the single process's updates over the same global batch (every
config: tests/test_parallel_matrix.py, with tests/dist_matrix.py's bounds); float32 masters take an update at lr 1e-6;
a run killed after step 2 resumes to the same step 3; a NaN on one rank skips the update on every rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from launch import ROOT, fsdp_cmd, ranks, thinkrl_script

from thinkrl.run.jsonl import read_jsonl

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo")

LENGTH = "{name: short, function: 'thinkrl.rewards:length_penalty', weight: 1, options: {max_chars: 40}}"
# a reward that varies within every group even when no answer is right: every step has a gradient
REWARDS = f"reward.functions=[{{name: correct, function: verifier, weight: 1}}, {LENGTH}]"


def update_run(model: str, out: Path, *args: str, sharded: bool) -> dict:
    """tests/dist_update.py in one process, or in two under the FSDP config; its saved result."""
    script = [str(HERE / "dist_update.py"), model, str(out), "grpo", *args]
    if sharded:
        ranks([*fsdp_cmd(), *script])
    else:  # the speed-ups off, as FSDP has them (thinkrl/sharding.py): the same arithmetic on both sides
        env = {**os.environ, "OMP_NUM_THREADS": "1", "THINKRL_ACCEL": "0"}
        proc = subprocess.run([sys.executable, *script], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


def test_a_nan_on_one_rank_skips_that_update_on_every_rank(tiny_model_dir, tmp_path):
    """Rank 1's forward overflows in update 2: both ranks skip it, so the weights are those after update 1."""
    args = ("--adamw",)
    once = update_run(str(tiny_model_dir), tmp_path / "once.pt", *args, "--steps", "1", sharded=True)
    nan = update_run(str(tiny_model_dir), tmp_path / "nan.pt", *args, "--steps", "2", "--nan", "1:2", sharded=True)
    for rank, metrics in enumerate(nan["by_rank"]):
        assert [m["update/skipped_nonfinite"] for m in metrics] == [0, 1], rank
        assert [m["update/optimizer_steps"] for m in metrics] == [1, 0], rank
    for name, delta in once["delta"].items():
        assert delta.abs().max() > 0, name
        assert torch.equal(nan["delta"][name], delta), name  # no shard moved in update 2


def test_fsdp2_float32_masters_gathered_in_bfloat16_take_an_update_at_lr_1e_6(tiny_model_dir, tmp_path):
    """A full fine-tune computing in bfloat16 under FSDP2 (sharding.precision_policy: float32 shards gathered in
    bfloat16, gradients reduce-scattered in float32): one AdamW update at lr 1e-6 moves almost every weight, as
    one process under autocast does (tests/test_master_weights.py); pure bfloat16 would move about 2%."""
    args = ("--adamw", "--as-run", *("-o", "model.dtype=bfloat16", "-o", "model.lora.rank=0", "-o", "train.lr=1e-6"))
    two = update_run(str(tiny_model_dir), tmp_path / "two.pt", *args, sharded=True)
    assert two["sharded"] and two["metrics"]["update/optimizer_steps"] == 1
    moved = sum(int((d != 0).sum()) for d in two["delta"].values()) / sum(d.numel() for d in two["delta"].values())
    assert moved > 0.9, moved


def train_args(model: str, out: Path, lora: str) -> list[str]:
    settings = ["train.steps=3", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=12"]
    settings += ["verifier.workers=1", "train.save_every=1", f"model.lora.rank={lora}", REWARDS]
    # a pi_old pass and a reference pass in every step: the passes that must run through the sharded root
    settings += ["train.mini_batches=2", "method.beta=0.04"]
    return ["train", "--model", model, "-O", str(out), *[x for s in settings for x in ("-o", s)]]


def comparable(metrics: list[dict]) -> list[dict]:
    """metrics.jsonl lines without the wall times and speeds, which differ from run to run, and the agreement
    gap, which a process logs on the steps it checks: its first (the resumed step 3 too) and after an update."""
    skip = lambda k: k.startswith("time/") or "tokens" in k or k == "mismatch/agreement_gap"  # noqa: E731
    return [{k: v for k, v in m.items() if not skip(k)} for m in metrics]


def same(x, y) -> bool:
    """Equal nested state: tensors bit for bit."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(map(same, x, y))
    return x == y


@pytest.mark.slow
@pytest.mark.parametrize("lora", ["16", "0"], ids=["lora", "full-fine-tune"])
def test_fsdp2_run_killed_after_step_2_resumes_to_the_same_step_3(tiny_model_dir, tmp_path, lora):
    """`accelerate launch --config_file configs/accelerate/fsdp.yaml thinkrl train`: both ranks are SIGKILLed in
    step 3 (after its optimizer step, before anything of it is written); --resume loads the sharded run from the
    step-2 checkpoint and its step 3 is the uninterrupted run's, to the bit. Each step runs a pi_old pass and a
    reference pass (through the sharded root; a full fine-tune's reference sharded too). The tiny model: the same
    code as the bundled one at a quarter of the time."""
    name = str(tiny_model_dir)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    ranks([*fsdp_cmd(), *thinkrl_script(), *train_args(name, whole, lora)])
    env = {"THINKRL_KILL": "update:3", "THINKRL_KILL_ROOT": str(killed), "PYTHONPATH": str(HERE)}
    proc = ranks([*fsdp_cmd(), str(HERE / "killpoints.py"), *train_args(name, killed, lora)], env=env, check=False)
    assert proc.returncode != 0 and "killpoint update 3" in proc.stderr, proc.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(killed / "metrics.jsonl")] == [1, 2]
    ranks([*fsdp_cmd(), *thinkrl_script(), "train", "--resume", str(killed)])
    a, b = read_jsonl(whole / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert comparable(a) == comparable(b)
    assert a[2]["grad_norm"] > 0 and a[2]["update/optimizer_steps"] == 2  # step 3 trained both mini-batches
    kind = "adapter/adapter_model.safetensors" if lora != "0" else "model/model.safetensors"
    ckpt = lambda run: run / "checkpoints" / "step-3"  # noqa: E731
    assert (ckpt(whole) / kind).read_bytes() == (ckpt(killed) / kind).read_bytes()
    for part in ("optimizer.pt", "scheduler.pt"):
        assert same(*(torch.load(ckpt(r) / part, weights_only=True) for r in (whole, killed))), part
    shutil.rmtree(tmp_path)  # a full fine-tune's checkpoints are large: free the disk at once


@pytest.mark.slow
@pytest.mark.parametrize("lora", ["16", "0"], ids=["lora", "full-fine-tune"])
def test_thinking_seeds_under_fsdp2_seeds_from_every_checkpoint_any_rank_drew(tiny_model_dir, tmp_path, lora):
    """configs/thinking_seeds.yaml under the FSDP config: the pool takes the gathered weights at steps 0, 1, 2 and
    from step 2 rows are seeded. Rebuilding a historical checkpoint gathers the frozen base on every rank (LoRA),
    so each rank rebuilds every checkpoint any rank drew; a full fine-tune keeps an on-disk pool per rank."""
    run = tmp_path / "run"
    settings = ["train.steps=4", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=12"]
    settings += ["verifier.workers=1", f"model.lora.rank={lora}", "seeds.every=1", "seeds.per_group=3", REWARDS]
    args = ["train", str(ROOT / "configs/thinking_seeds.yaml"), "--model", str(tiny_model_dir), "-O", str(run)]
    ranks([*fsdp_cmd(), *thinkrl_script(), *args, *[x for s in settings for x in ("-o", s)]])
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["seeds/pool_size"] for m in metrics] == [1, 2, 3, 4]  # the pinned initial policy, then one a step
    assert all(m["seeds/seeded_frac"] > 0 for m in metrics[1:]) and all(m["update/optimizer_steps"] for m in metrics)
    assert (run / "seeds" / "rank-1").is_dir() == (lora == "0")  # LoRA adapters stay in memory


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "error: thinkrl does not run under DeepSpeed"),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, "error: FSDP version 1 was asked for; thinkrl runs FSDP2 only"),
    ],
    ids=["deepspeed", "fsdp1"],
)
def test_a_launcher_thinkrl_does_not_run_under_is_refused_in_one_line(tiny_model_dir, tmp_path, env, says):
    proc = subprocess.run(
        [*thinkrl_script_py(), "train", "--model", str(tiny_model_dir), "-O", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.returncode == 2 and proc.stderr.startswith(says), proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def thinkrl_script_py() -> list[str]:
    script = thinkrl_script()
    return script if script[0] != "-m" else [sys.executable, *script]
