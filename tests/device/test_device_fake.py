"""The fake device itself (tests/device/fakedevice.py): it refuses what CUDA refuses and lets through what CUDA
lets through, so that a test on it fails for a CUDA-only defect and for nothing else."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fakedevice import DeviceGenerator, DeviceTensor, nccl_collectives

pytestmark = pytest.mark.device

MIXED = "Expected all tensors to be on the same device, but found at least two devices, fakegpu:0 and cpu!"


def test_device_tensors_compute_as_the_cpu(fakegpu):
    x = torch.arange(6.0).reshape(2, 3).to(fakegpu)  # (2, 3)
    y = torch.ones(3, device=fakegpu)
    assert isinstance(x, DeviceTensor) and x.device == fakegpu and not x.is_cpu
    out = (x * 2 + y).sum(0)  # (3,)
    assert out.device == fakegpu
    assert out.cpu().tolist() == out.tolist() == [8.0, 12.0, 16.0]
    assert out.sum().item() == 36.0
    view = x[:, 1:]  # in place through a view reaches its base
    view.zero_()
    assert x.tolist() == [[0.0, 0.0, 0.0], [3.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "op",
    [
        lambda x, c: x + c,
        lambda x, c: torch.where(c > 0, x, 0.0),
        lambda x, c: torch.cat([x, c]),
        lambda x, c: x.index_select(0, c.long()),
        lambda x, c: x @ c,
    ],
    ids=["add", "where", "cat", "index_select", "matmul"],
)
def test_a_cpu_tensor_meeting_a_device_tensor_raises(fakegpu, op):
    with pytest.raises(RuntimeError, match=MIXED):
        op(torch.ones(3, device=fakegpu), torch.ones(3))


def test_what_cuda_lets_through(fakegpu):
    x = torch.zeros(4, device=fakegpu)
    assert (x + torch.tensor(2.0)).tolist() == [2.0] * 4  # a 0-dim CPU tensor is a scalar
    x[torch.tensor([1, 3])] = 1.0  # CPU indices of an indexing op
    assert x[torch.tensor([0, 1])].tolist() == [0.0, 1.0]
    x.copy_(torch.arange(4.0))  # copies between devices
    cpu = torch.empty(4)
    cpu.copy_(x)
    assert cpu.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_module_moves_with_its_tied_weights(fakegpu):
    emb, head = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head).to(fakegpu)
    assert isinstance(model[0].weight, DeviceTensor) and model[1].weight is model[0].weight
    model(torch.tensor([[1, 2]], device=fakegpu)).sum().backward()
    assert isinstance(model[0].weight.grad, DeviceTensor)
    with pytest.raises(RuntimeError, match=MIXED):
        model(torch.tensor([[1, 2]]))  # ids left on the CPU


def test_generators(fakegpu):
    g = torch.Generator(device=fakegpu).manual_seed(3)
    assert isinstance(g, DeviceGenerator) and isinstance(g, torch.Generator) and g.device == fakegpu
    drawn = torch.randint(0, 100, (4,), generator=g, device=g.device)
    assert drawn.device == fakegpu
    assert torch.randint(0, 100, (4,), generator=g.manual_seed(3), device=fakegpu).tolist() == drawn.tolist()
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'fakegpu'"):
        torch.randint(0, 100, (4,), generator=g)
    with pytest.raises(RuntimeError, match="Expected a 'fakegpu' device type for generator but found 'cpu'"):
        torch.rand(4, generator=torch.Generator(), device=fakegpu)
    with pytest.raises(RuntimeError, match="Expected a 'fakegpu' device type for generator but found 'cpu'"):
        torch.bernoulli(torch.full((4,), 0.5, device=fakegpu), generator=torch.Generator())
    assert torch.bernoulli(torch.full((4,), 0.5, device=fakegpu), generator=g).device == fakegpu
    assert type(torch.Generator()) is not DeviceGenerator


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_collectives_refuse_cpu_tensors(fakegpu, one_rank):
    with nccl_collectives():
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.ones(2, dtype=torch.float64))
        t = torch.ones(2, dtype=torch.float64, device=fakegpu)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.tolist() == [1.0, 1.0]
        gathered = [torch.zeros(2, device=fakegpu)]
        dist.all_gather(gathered, torch.ones(2, device=fakegpu))
        assert gathered[0].tolist() == [1.0, 1.0]
    dist.all_reduce(torch.ones(2))  # gloo itself, once the fake is gone


def test_in_another_thread(fakegpu):
    """Without the modes (they are the entering thread's), the backend's kernels and DeviceTensor do the work."""
    from concurrent.futures import ThreadPoolExecutor

    def work():
        x = torch.tensor([1.0, 2.0], device=fakegpu) + torch.zeros(2, device=fakegpu)
        assert isinstance(x, DeviceTensor) and x.tolist() == [1.0, 2.0]
        with pytest.raises(RuntimeError, match=MIXED):
            x + torch.ones(2)
        return x.cpu()

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(work).result().tolist() == [1.0, 2.0]
