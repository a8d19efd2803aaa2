"""The loop's collectives (thinkrl/distributed.py) as a multi-GPU run meets them: Accelerate starts NCCL there,
which serves device tensors only. Two ranks of a real gloo group, with the fake's NCCL refusal in front of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch import ranks, torchrun_cmd

pytestmark = pytest.mark.device

CHILD = Path(__file__).with_name("collectives_child.py")


def test_the_loops_collectives_on_the_device(tmp_path):
    out = tmp_path / "out.json"
    ranks([*torchrun_cmd(2), str(CHILD), str(out)], env={"PYTHONPATH": f"{CHILD.parent}:{CHILD.parent.parent}"})
    got = json.loads(out.read_text())
    assert got["all_sum"] == [0.1 + 1.1, 2.0**53 + 1, -6.0]  # float64 on the device: exact
    assert got["all_max"] == 0.5
    assert got["sum_dicts"] == {"rank0": 2.0, "rank1": 3.0, "shared": 3.0}
    # rank 0's 2 x 2 rows then rank 1's 3 x 3, padded with zeros to the longest; rank 0's start at row 0
    assert got["gather_rows"] == [[0, 1, 0], [3, 4, 0], [0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert (got["start"], got["device"]) == (0, "fakegpu:0")
    assert got["mask"] == [[True, False], [True, True]]
    assert got["summed"] == [3.0, 3.0]
