"""Packed linear layers (thinkrl/accel/packed.py): the same numbers as F.linear up to summation order, gradients to
the input through a frozen base, and nothing left changed after the block."""

import pytest
import torch
import torch.nn.functional as F

from thinkrl.accel.packed import PackedLinear, can_pack, packed_frozen_linears

pytestmark = pytest.mark.usefixtures("accel_on")  # tests of the CPU speed-ups themselves


def test_packed_linear_matches_f_linear_for_any_rows_and_shape():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    lin = PackedLinear(w, b, rows=16)
    for shape in ((1, 32), (7, 32), (3, 5, 32)):
        x = torch.randn(*shape, generator=g)
        out = lin(x)
        assert out.shape == (*shape[:-1], 48)
        torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_packed_linear_is_a_copy_and_falls_back_where_nothing_packs():
    w = torch.randn(8, 4)
    lin = PackedLinear(w)
    x = torch.randn(2, 4)
    before = lin(x)
    w.add_(1.0)  # a later in-place update of the weight is not seen: build a new one after every update
    assert torch.equal(lin(x), before)
    double = PackedLinear(w.double())  # float64: oneDNN does not pack it, plain F.linear runs
    assert not double.packed and not can_pack(w.double())
    assert torch.equal(double(x.double()), F.linear(x.double(), w.double()))


@pytest.mark.parametrize("transposed", [False, True])  # dx = dy W through MKL on W, or through a packed W^T
def test_frozen_linears_pack_for_the_block_and_pass_gradients_to_their_input(transposed, monkeypatch):
    import thinkrl.accel.packed as packed_module

    through = []  # per backward: did dx run through a packed W^T?
    plain_input_grad = packed_module.input_grad
    monkeypatch.setattr(packed_module, "input_grad", lambda g, w, wt: (through.append(wt is not None), plain_input_grad(g, w, wt))[1])
    torch.manual_seed(0)
    frozen, trained = torch.nn.Linear(16, 24), torch.nn.Linear(24, 8)
    frozen.requires_grad_(False)
    model = torch.nn.Sequential(frozen, torch.nn.Tanh(), trained)
    x = torch.randn(5, 16, requires_grad=True)

    def grads():
        x.grad = None
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        return out.detach(), x.grad.clone(), trained.weight.grad.clone()

    plain = grads()
    with packed_frozen_linears(model, rows=8, transposed=transposed) as n:
        packed = grads()
        assert "forward" in frozen.__dict__ and "forward" not in trained.__dict__
        assert ("_thinkrl_packed_t" in frozen.__dict__) == (transposed and n == 1)  # W^T packed only when asked
    assert n == (1 if can_pack(frozen.weight) else 0)
    assert through == ([transposed] if n == 1 else [])  # the block's one backward through the frozen layer
    assert "forward" not in frozen.__dict__  # the class's forward again
    assert frozen.weight.grad is None  # frozen stays frozen
    for a, b in zip(plain, packed):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert torch.equal(grads()[0], plain[0])  # after the block: F.linear again, bit for bit


def test_the_packed_copy_is_kept_across_blocks_until_the_weight_changes():
    import copy

    lin = torch.nn.Linear(8, 6).requires_grad_(False)
    model = torch.nn.Sequential(lin)
    x = torch.randn(3, 8)
    with packed_frozen_linears(model, rows=4):
        first = lin.__dict__.get("_thinkrl_packed")
        model(x)
    with packed_frozen_linears(model, rows=4):
        assert lin.__dict__.get("_thinkrl_packed") is first  # packed once, not once per block
    with torch.no_grad():
        lin.weight.mul_(2.0)  # written in place: the next block packs again
    with packed_frozen_linears(model, rows=4):
        if first is not None:
            assert lin.__dict__["_thinkrl_packed"] is not first
        torch.testing.assert_close(model(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-6)
    with packed_frozen_linears(model, rows=4, transposed=True):
        first_t = lin.__dict__.get("_thinkrl_packed_t")
    with packed_frozen_linears(model, rows=4, transposed=True):
        assert lin.__dict__.get("_thinkrl_packed_t") is first_t  # W^T too: packed once, kept for the next block
    twin = copy.deepcopy(model)  # packed tensors cannot be copied: a copy carries none and packs its own
    assert twin[0].__dict__.get("_thinkrl_packed") is None
    with packed_frozen_linears(twin, rows=4):
        torch.testing.assert_close(twin(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_forward_installed_by_a_wrapper_is_put_back():
    """A wrapper (Accelerate's hooks) may have set an instance-level forward: the block restores that one,
    not the class's."""
    lin = torch.nn.Linear(4, 3).requires_grad_(False)
    calls = []

    def hooked(x):
        calls.append(1)
        return torch.nn.Linear.forward(lin, x)

    lin.forward = hooked
    with packed_frozen_linears(torch.nn.Sequential(lin), rows=4) as n:
        lin(torch.randn(2, 4))
        assert calls == [] or n == 0  # packed: the hook is not the forward inside the block
    assert lin.forward is hooked
    lin(torch.randn(2, 4))
    assert calls  # the wrapper's forward again
