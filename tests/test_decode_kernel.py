"""The decode attention kernel (thinkrl/rollout/engines/decode_kernel.py, decode_attention.c): the attention
SDPA computes with a per-row length mask, for every head size; a row's output independent of the other rows;
the lean engine's samples unchanged by it; a clear fallback where it cannot be built; and loading it leaves
the process's float mode alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from thinkrl.rollout.engines import decode_kernel

needs_kernel = pytest.mark.skipif(decode_kernel.load() is None, reason="no C compiler here to build the kernel")


def storage(slots: int, key_heads: int, capacity: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(slots, key_heads, capacity, dim, generator=g) for _ in range(2))  # type: ignore[return-value]


def sdpa(q, keys, values, lengths):
    """The reference: SDPA over the first lengths[r] positions of each row, the rest masked."""
    n, C = q.shape[0], keys.shape[2]
    mask = (torch.arange(C)[None] < lengths[:, None])[:, None, None]  # (n, 1, 1, C)
    return F.scaled_dot_product_attention(q, keys[:n], values[:n], attn_mask=mask)


@needs_kernel
@pytest.mark.parametrize("dim", [64, 128, 8, 48])  # the two unrolled head sizes and the general code
@pytest.mark.parametrize("group", [1, 3])
def test_the_kernel_computes_masked_attention(dim, group):
    keys, values = storage(slots=6, key_heads=2, capacity=40, dim=dim)
    q = torch.randn(4, 2, group, dim, generator=torch.Generator().manual_seed(1)) * 2
    lengths = torch.tensor([1, 17, 40, 9])  # one position, some, all of the capacity
    out = decode_kernel.StepAttention(lengths, 2, group)(q, keys, values)
    assert out.shape == q.shape
    torch.testing.assert_close(out, sdpa(q, keys, values, lengths), atol=2e-6, rtol=1e-5)
    # a one-position row is exactly its value vector
    torch.testing.assert_close(out[0], values[0, :, :1].expand(2, group, dim), atol=1e-6, rtol=0)


@needs_kernel
def test_a_rows_output_does_not_depend_on_the_other_rows():
    keys, values = storage(slots=5, key_heads=3, capacity=32, dim=64)
    q = torch.randn(5, 3, 3, 64, generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([32, 5, 12, 1, 30])
    together = decode_kernel.StepAttention(lengths, 3, 3)(q, keys, values)
    alone = decode_kernel.StepAttention(lengths[:1], 3, 3)(q[:1], keys, values)
    assert torch.equal(together[:1], alone)  # the same bits, batched or not


@needs_kernel
def test_rows_past_the_capacity_are_refused():
    keys, values = storage(slots=2, key_heads=1, capacity=8, dim=64)
    q = torch.randn(2, 1, 1, 64)
    with pytest.raises(AssertionError):
        decode_kernel.StepAttention(torch.tensor([8, 9]), 1, 1)(q, keys, values)
    with pytest.raises(AssertionError):
        decode_kernel.StepAttention(torch.tensor([0, 3]), 1, 1)


@needs_kernel
def test_lean_generation_samples_the_same_with_and_without_the_kernel(tmp_path, monkeypatch):
    """A model with 64-dim heads (the unrolled code), decoded with the kernel and with SDPA."""
    from tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    from thinkrl.rollout.completions import Sampling
    from thinkrl.rollout.engines.lean import lean_generate

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", heads=2, head_dim=64)).eval().requires_grad_(False)
    prompts = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 73, 74, 75, 76, 5]]

    def generate():
        return lean_generate(model, prompts, 3, Sampling(20, 1.0), [1], 0, torch.Generator().manual_seed(5), slots=4)[0]

    calls = []
    real = decode_kernel.StepAttention.__call__
    monkeypatch.setattr(decode_kernel.StepAttention, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    with_kernel = generate()
    assert calls  # the kernel did run
    monkeypatch.setattr(decode_kernel, "_loaded", [None])  # as with THINKRL_DECODE_KERNEL=0
    calls.clear()
    without = generate()
    assert not calls
    assert torch.equal(with_kernel.tokens, without.tokens) and torch.equal(with_kernel.lengths, without.lengths)
    torch.testing.assert_close(with_kernel.behav_logp, without.behav_logp, atol=1e-5, rtol=0)


def test_switched_off_or_without_a_compiler_the_decoder_falls_back_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(decode_kernel, "_loaded", [])
    monkeypatch.setenv("THINKRL_DECODE_KERNEL", "0")
    assert decode_kernel.load() is None and not decode_kernel.usable(torch.zeros(1, 1, 1, 8))

    monkeypatch.setattr(decode_kernel, "_loaded", [])
    monkeypatch.delenv("THINKRL_DECODE_KERNEL")
    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path))  # nothing built here yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(UserWarning, match="decode attention kernel is unavailable.*no-such-cc"):
        assert decode_kernel.load() is None
    assert not list(tmp_path.rglob("*.so"))


@needs_kernel
def test_loading_the_kernel_leaves_denormal_floats_alone():
    """It is compiled with -ffast-math but linked without it: no start-up code flushes denormals to zero."""
    tiny = torch.tensor([1e-39])  # a float32 denormal
    assert decode_kernel.load() is not None
    assert (tiny * 0.5).item() != 0.0
