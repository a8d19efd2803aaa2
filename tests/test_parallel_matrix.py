"""Every shipped config under both multi-process layouts: configs/accelerate/fsdp.yaml (FSDP2) and ddp.yaml as
shipped, 2 processes on the CPU over gloo, against one process over the same global batch (tests/dist_matrix.py).

Two updates of each case; each update's loss, gradient norm and entropy, and the weights after both, must be the
single process's within the bounds tests/dist_matrix.py states. The cases: all 20 configs with LoRA (kl_cov's
with pi_old = mu: dist_matrix.KINKED), grpo and gspo (several mini-batches, so a pi_old pass) fully fine-tuned,
grpo with a reference (LoRA and full), a mini-batch split finer than the ranks (a rank with no row in most
mini-batches), the batch-statistics methods with their selection switched on in this batch (stapo silencing,
stare's gate open, ict by position, clip_cov's draw, kl_cov's penalty), and the IcePop and IPO masks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_matrix import CASES, mismatches
from launch import ROOT, ranks

HERE = Path(__file__).resolve().parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo"),
]

LAYOUTS = ("fsdp", "ddp")


@pytest.fixture(scope="module")
def results(tiny_model_dir, tmp_path_factory) -> dict[str, dict]:
    """{layout: dist_matrix.py's result}: one process (the speed-ups off, as FSDP has them), then each layout."""
    out = tmp_path_factory.mktemp("matrix")
    script = [str(HERE / "dist_matrix.py"), str(tiny_model_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THINKRL_ACCEL": "0", "PYTHONPATH": str(HERE)}
    proc = subprocess.run([sys.executable, script[0], script[1], str(out / "one.pt"), *CASES], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {"one": torch.load(out / "one.pt")}
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    for layout in LAYOUTS:
        config = ROOT / "configs" / "accelerate" / f"{layout}.yaml"
        cmd = [accelerate, "launch", "--main_process_port", "0", "--config_file", str(config), script[0], script[1]]
        ranks([*cmd, str(out / f"{layout}.pt"), *CASES], env={"PYTHONPATH": str(HERE)})
        found[layout] = torch.load(out / f"{layout}.pt")
    return found


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_processes_train_the_one_process_updates(results, layout, case):
    one, two = results["one"], results[layout]
    assert (one["world"], two["world"]) == (1, 2)
    assert two["type"] == ("DistributedType.FSDP" if layout == "fsdp" else "DistributedType.MULTI_CPU")
    assert not mismatches(one, two, case)
