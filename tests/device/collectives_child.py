"""One rank of tests/device/test_device_collectives.py (under torchrun, a gloo group): the loop's collectives
(thinkrl/distributed.py) on the fake device with NCCL's refusal of CPU tensors; rank 0 writes what they returned.

    torchrun --nproc_per_node 2 tests/device/collectives_child.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
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
        # the batch-statistics collectives: rows of another length per rank, a bool mask, a sum in place
        rows = torch.arange(3 * (2 + rank), dtype=torch.float32, device=device).reshape(2 + rank, 3)[:, : 2 + rank]
        whole, start = distributed.gather_rows(rows)
        mask, _ = distributed.gather_rows(torch.ones((1, 1 + rank), dtype=torch.bool, device=device))
        summed = distributed.all_sum_tensor(torch.full((2,), 1.0 + rank, device=device))
        out.update(gather_rows=whole.tolist(), start=start, device=str(whole.device), mask=mask.tolist(), summed=summed.tolist())
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    distributed.shutdown()


if __name__ == "__main__":
    main()
