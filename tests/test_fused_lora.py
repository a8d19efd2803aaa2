"""Fused LoRA layers (thinkrl/accel/fused_lora.py): peft's values and gradients in one operation per layer, peft's own
forward wherever the fusion does not apply, and the layers as they were after the block."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

import thinkrl.accel.fused_lora as fused
from thinkrl.accel.fused_lora import fused_lora_layers
from thinkrl.accel.packed import can_pack

pytestmark = pytest.mark.usefixtures("accel_on")  # tests of the CPU speed-ups themselves


def _model(dropout: float = 0.0, **lora):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.SiLU(), torch.nn.Linear(48, 16, bias=False))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=12, target_modules=["0", "2"], lora_dropout=dropout, **lora))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero, which would hide any mistake in the low-rank term
            torch.nn.init.normal_(p)
    return model


def _run(model, x, block=None):
    """Output, input gradient and trainable-parameter gradients of sum(y^2), inside `block` if given."""
    model.zero_grad()
    x = x.detach().requires_grad_(True)
    with block if block is not None else torch.enable_grad():
        y = model(x)
        y.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return y.detach(), x.grad.clone(), grads


@pytest.fixture
def calls(monkeypatch):
    """How many times the fused operation ran."""
    seen = []
    forward = fused._LoRALinear.forward
    monkeypatch.setattr(fused._LoRALinear, "forward", staticmethod(lambda *a: (seen.append(1), forward(*a))[1]))
    return seen


@pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="oneDNN cannot pack float32 weights in this torch build")
@pytest.mark.parametrize("transposed", [False, True])  # the input gradient through MKL on W, or a packed W^T
def test_fused_layers_give_peft_values_and_gradients(calls, monkeypatch, transposed):
    through = []  # per backward: did the input gradient run through a packed W^T?
    plain_input_grad = fused.input_grad
    monkeypatch.setattr(fused, "input_grad", lambda g, w, wt: (through.append(wt is not None), plain_input_grad(g, w, wt))[1])
    model = _model()
    x = torch.randn(3, 5, 32)  # (B, T, in): the fused op flattens and restores the leading dims
    plain = _run(model, x)
    with fused_lora_layers(model, rows=8, transposed=transposed) as n:
        got = _run(model, x)
    assert n == 2 and len(calls) == 2
    assert through == [transposed, transposed]  # both layers' input gradients (the second's output feeds the first)
    torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], plain[1], rtol=1e-5, atol=1e-5)
    assert got[2].keys() == plain[2].keys() and len(plain[2]) == 4  # A and B of both layers
    for name in plain[2]:
        torch.testing.assert_close(got[2][name], plain[2][name], rtol=1e-4, atol=1e-4)  # float32 sums in another order
    for m in model.modules():  # after the block, every layer has its own forward again
        assert "forward" not in m.__dict__


@pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="oneDNN cannot pack float32 weights in this torch build")
def test_no_input_gradient_is_computed_where_the_input_needs_none():
    model = _model()
    x = torch.randn(4, 32)  # not requiring grad, like the first layer's input under frozen embeddings
    with fused_lora_layers(model, rows=8):
        model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="oneDNN cannot pack float32 weights in this torch build")
def test_calls_the_fusion_does_not_cover_run_peft_forward(calls):
    x = torch.randn(4, 32)
    model = _model()
    with fused_lora_layers(model, rows=8), model.disable_adapter():  # the reference pass: base weights only
        y = model(x)
    assert not calls
    base = model.base_model.model
    torch.testing.assert_close(y, base[2].base_layer(torch.nn.functional.silu(base[0].base_layer(x))))

    with fused_lora_layers(model, rows=8), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16  # autocast's precision, as peft gives it
    assert not calls

    noisy = _model(dropout=0.5)  # dropout active (train mode): peft draws the mask
    noisy.train()
    with fused_lora_layers(noisy, rows=8):
        noisy(x)
    assert not calls
    noisy.eval()  # dropout inactive: fused again
    with fused_lora_layers(noisy, rows=8):
        noisy(x)
    assert len(calls) == 2


def test_layers_oneDNN_cannot_pack_are_left_to_peft(calls):
    model = _model().double()  # float64: no packed base, so no fusion
    with fused_lora_layers(model, rows=8) as n:
        model(torch.randn(4, 32, dtype=torch.float64))
    assert n == 0 and not calls


@pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="oneDNN cannot pack float32 weights in this torch build")
@pytest.mark.parametrize("chunk_elems", [2**25, 3 * 105])  # the head in one chunk, and in chunks of 3 rows (p recomputed)
def test_the_update_phase_blocks_give_the_plain_log_probs_and_gradients(tiny_model_dir, monkeypatch, chunk_elems):
    """A LoRA model's completion pass inside the update phase's blocks (packed frozen base and head, fused
    LoRA layers) against the same pass without them: the same log-probs, entropies and adapter gradients up to
    float32 summation order; and the head's logits did come from its packed copy."""
    from tiny import tiny_lora_model

    import thinkrl.forward as forward
    from thinkrl.accel.packed import packed_frozen_linears
    from thinkrl.learner.logprobs import token_logprobs

    monkeypatch.setattr(forward, "CHUNK_ELEMS", chunk_elems)
    model = tiny_lora_model(tiny_model_dir)
    head = model.get_output_embeddings()
    assert not head.weight.requires_grad
    prompts = [[4, 65, 24, 17, 36], [4, 65, 24, 17, 36], [4, 70, 71, 72, 5]]
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 5])[:, None]  # (3, 6)
    completions = torch.where(mask, torch.randint(7, 100, (3, 6), generator=torch.Generator().manual_seed(1)), 0)

    def run():
        model.zero_grad()
        out = token_logprobs(model, prompts, completions, mask, pad_id=0, temperature=0.7, entropy=True)
        (out.logp * torch.linspace(-1, 1, 6)).sum().backward()
        return out.logp.detach(), out.entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain = run()
    head_calls = []
    with packed_frozen_linears(model, 8), fused_lora_layers(model, 8) as n:
        head.register_forward_hook(lambda *_: head_calls.append(1))
        got = run()
    assert n > 0 and head_calls  # fused layers ran, and FusedHead took its logits from the (packed) head
    torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], plain[1], rtol=1e-5, atol=1e-5)
    for name in plain[2]:
        torch.testing.assert_close(got[2][name], plain[2][name], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="oneDNN cannot pack float32 weights in this torch build")
def test_split_gradients_are_each_segments_own():
    """Inside segment_grads, the layers split A's and B's gradients by runs of input rows: segment k's part of
    one backward over the whole batch equals peft's gradient of segment k's loss alone, a layer called twice
    (x, then z) adds both calls, and the parts sum to the whole. A call whose rows do not split is refused."""
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    x, z = torch.randn(4, 5, 32), torch.randn(2, 3, 32)  # (rows, positions, in): 2 segments of 2 rows, then of 1
    c = torch.linspace(-1, 2, 16)

    def loss(xs, zs):
        return (model(xs).square() * c).sum() + model(zs).sum()

    own = [torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss(x[2 * k : 2 * k + 2], z[k : k + 1]), params)]) for k in (0, 1)]
    with fused_lora_layers(model, rows=8), fused.segment_grads(2) as seg:
        whole = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss(x, z), params)])
        assert seg.covers(params)
        split = seg.flat(params)  # (2, P)
    assert split.shape == (2, whole.numel())
    # float32 sums in another order: an element's error scales with the largest terms summed into it, not with
    # its own value (B starts random here, so elements reach thousands; measured error up to 4e-7 of the largest);
    # a part off by one segment is off by the whole gradient's scale
    scale = float(whole.abs().max())
    for k in (0, 1):
        torch.testing.assert_close(split[k], own[k], rtol=1e-4, atol=1e-6 * scale)
    torch.testing.assert_close(split.sum(0), whole, rtol=1e-4, atol=1e-6 * scale)
    with fused_lora_layers(model, rows=8), fused.segment_grads(2) as seg:
        model(torch.randn(3, 5, 32))  # 3 rows: not two equal runs
        assert not seg.covers(params)
    assert fused._segments is None  # the block leaves no split behind
