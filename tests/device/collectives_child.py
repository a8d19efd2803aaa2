"""One rank of tests/device/test_device_collectives.py (under torchrun, a gloo group): the loop's collectives
(thinkrl/distributed.py) on the fake device with NCCL's refusal of CPU tensors; rank 0 writes what they returned.

    torchrun --nproc_per_node 2 tests/device/collectives_child.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from fakedevice import fake_device, nccl_collectives

from thinkrl import distributed


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with fake_device() as device, nccl_collectives():
        distributed.set_device(device)  # what train.py does with the Accelerator's device
        out = {
            "all_sum": distributed.all_sum([0.1 + rank, 2.0**52 + rank, -3.0]),
            "all_max": distributed.all_max(0.5 - rank),
            "sum_dicts": distributed.sum_dicts({"shared": 1.5, f"rank{rank}": 2.0 + rank}),
        }
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    distributed.shutdown()


if __name__ == "__main__":
    main()
