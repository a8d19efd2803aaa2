"""The decode attention kernel (thinkrl/accel/decode_kernel.py, decode_attention.c): transformers'
rotary embedding, the new key and value stored, and the attention SDPA computes with a per-row length mask,
for every head size; a row's output independent of the other rows;
the lean engine's samples unchanged by it; a clear fallback where it cannot be built; and loading it leaves
the process's float mode alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from thinkrl.accel import decode_kernel, native

pytestmark = pytest.mark.usefixtures("accel_on")  # tests of the CPU speed-ups themselves

needs_kernel = pytest.mark.skipif(decode_kernel.load() is None, reason="no C compiler here to build the kernel")


def storage(slots: int, key_heads: int, capacity: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(slots, key_heads, capacity, dim, generator=g) for _ in range(2))  # type: ignore[return-value]


def step_inputs(n: int, key_heads: int, group: int, dim: int, seed: int = 1):
    """A layer's qkv (n, Hq + 2 Hk, D) and rotary tables (n, D) as a rotary embedding makes them."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, key_heads * (group + 2), dim, generator=g) * 2
    angle = torch.rand(n, dim // 2, generator=g) * 6
    angle = torch.cat([angle, angle], dim=-1)  # (n, D): both halves share their angles
    return qkv, angle.cos(), angle.sin()


def reference(qkv, cos, sin, keys, values, positions, key_heads):
    """transformers' rotate-half rotary embedding, the new key and value written at positions[r], SDPA over
    the first positions[r] + 1 stored positions of each row, the rest masked."""
    n, D = cos.shape
    rot = lambda x: x * cos[:, None] + torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1) * sin[:, None]  # noqa: E731
    Hq = qkv.shape[1] - 2 * key_heads
    q, k, v = rot(qkv[:, :Hq]), rot(qkv[:, Hq : Hq + key_heads]), qkv[:, Hq + key_heads :]
    keys, values = keys.clone(), values.clone()
    keys[torch.arange(n), :, positions] = k
    values[torch.arange(n), :, positions] = v
    mask = (torch.arange(keys.shape[2])[None] <= positions[:, None])[:, None, None]  # (n, 1, 1, C)
    grouped = q.reshape(n, key_heads, Hq // key_heads, D)
    out = F.scaled_dot_product_attention(grouped, keys[:n], values[:n], attn_mask=mask)
    return out.reshape(n, Hq, D), keys, values


@needs_kernel
@pytest.mark.parametrize("dim", [64, 128, 8, 48])  # the two unrolled head sizes and the general code
@pytest.mark.parametrize("group", [1, 3, 5])  # blocks of queries: whole, split, with a remainder
def test_the_kernel_rotates_stores_and_computes_masked_attention(dim, group):
    keys, values = storage(slots=6, key_heads=2, capacity=40, dim=dim)
    qkv, cos, sin = step_inputs(4, 2, group, dim)
    positions = torch.tensor([0, 16, 39, 8])  # the first position, some, the last of the capacity
    want, want_keys, want_values = reference(qkv, cos, sin, keys, values, positions, 2)
    out = decode_kernel.DecodeStep(positions, cos, sin, 2, group)(qkv, keys, values)
    assert out.shape == (4, 2 * group, dim)
    torch.testing.assert_close(out, want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(keys, want_keys, atol=1e-6, rtol=1e-6)  # the new keys, rotated, in place
    assert torch.equal(values, want_values)  # the new values copied as they are; no other position touched
    # a row at position 0 attends to its own new value alone
    torch.testing.assert_close(out[0], qkv[0, 2 * group + 2 :].repeat_interleave(group, 0), atol=1e-6, rtol=0)


@needs_kernel
def test_a_rows_output_does_not_depend_on_the_other_rows():
    keys, values = storage(slots=5, key_heads=3, capacity=32, dim=64)
    qkv, cos, sin = step_inputs(5, 3, 3, 64, seed=2)
    positions = torch.tensor([31, 4, 11, 0, 29])
    together = decode_kernel.DecodeStep(positions, cos, sin, 3, 3)(qkv, keys.clone(), values.clone())
    alone = decode_kernel.DecodeStep(positions[:1], cos[:1], sin[:1], 3, 3)(qkv[:1], keys, values)
    assert torch.equal(together[:1], alone)  # the same bits, batched or not


@needs_kernel
def test_two_threads_give_one_threads_bits():
    """The kernel splits its (row, key head) tasks over OpenMP's threads, torch's count: the suite's workers run
    one thread each (conftest.py), so the split is checked here, whatever the runner's setting."""
    keys, values = storage(slots=6, key_heads=3, capacity=32, dim=64, seed=3)
    qkv, cos, sin = step_inputs(6, 3, 3, 64, seed=4)
    positions = torch.tensor([31, 4, 11, 0, 29, 17])
    threads, outs = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            k, v = keys.clone(), values.clone()
            outs.append((decode_kernel.DecodeStep(positions, cos, sin, 3, 3)(qkv, k, v), k, v))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*outs))  # each task writes its own rows: no sum changes order


@needs_kernel
def test_rows_past_the_capacity_are_refused():
    keys, values = storage(slots=2, key_heads=1, capacity=8, dim=64)
    qkv, cos, sin = step_inputs(2, 1, 1, 64)
    with pytest.raises(AssertionError, match="fit in the storage"):
        decode_kernel.DecodeStep(torch.tensor([7, 8]), cos, sin, 1, 1)(qkv, keys, values)
    with pytest.raises(AssertionError):
        decode_kernel.DecodeStep(torch.tensor([-1, 3]), cos, sin, 1, 1)
    with pytest.raises(AssertionError, match="even head dim"):  # rotate-half pairs the two halves
        decode_kernel.DecodeStep(torch.tensor([1]), torch.ones(1, 7), torch.ones(1, 7), 1, 1)
    with pytest.raises(AssertionError, match="query heads"):  # qkv of another head layout
        decode_kernel.DecodeStep(torch.tensor([1, 3]), cos, sin, 1, 1)(qkv[:, :2], keys, values)


@needs_kernel
def test_lean_generation_samples_the_same_with_and_without_the_kernel(tmp_path, monkeypatch):
    """A model with 64-dim heads (the unrolled code), decoded with the kernel and with SDPA."""
    from tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    from thinkrl.rollout.completions import Request, Sampling
    from thinkrl.rollout.engines.lean import lean_generate

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", heads=2, head_dim=64)).eval().requires_grad_(False)
    prompts = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 73, 74, 75, 76, 5]]

    def generate():
        return lean_generate(model, Request(prompts, 3, Sampling(20, 1.0), [1], 0, torch.Generator().manual_seed(5)), slots=4)[0]

    calls = []
    real = decode_kernel.DecodeStep.__call__
    monkeypatch.setattr(decode_kernel.DecodeStep, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    with_kernel = generate()
    assert calls  # the kernel did run
    monkeypatch.setattr(decode_kernel, "_loaded", [None])  # as with THINKRL_DECODE_KERNEL=0
    calls.clear()
    without = generate()
    assert not calls
    assert torch.equal(with_kernel.tokens, without.tokens) and torch.equal(with_kernel.lengths, without.lengths)
    torch.testing.assert_close(with_kernel.behav_logp, without.behav_logp, atol=1e-5, rtol=0)


def test_switched_off_or_without_a_compiler_the_decoder_falls_back_with_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(decode_kernel, "_loaded", [])
    monkeypatch.setenv("THINKRL_DECODE_KERNEL", "0")
    assert decode_kernel.load() is None and not decode_kernel.usable(torch.zeros(1, 1, 1, 8))

    monkeypatch.setattr(decode_kernel, "_loaded", [])
    monkeypatch.setattr(native, "_told_no_compiler", [])  # said once per process: maybe said already in this one
    monkeypatch.delenv("THINKRL_DECODE_KERNEL")
    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path))  # nothing built here yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    capsys.readouterr()
    assert decode_kernel.load() is None
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and err.count("\n") == 1, err
    assert "decode attention kernel is unavailable" in err and "no-such-cc" in err, err
    assert not list(tmp_path.rglob("*.so"))


@needs_kernel
def test_loading_the_kernel_leaves_denormal_floats_alone():
    """It is compiled with -ffast-math but linked without it: no start-up code flushes denormals to zero."""
    tiny = torch.tensor([1e-39])  # a float32 denormal
    assert decode_kernel.load() is not None
    assert (tiny * 0.5).item() != 0.0


def test_the_held_avx2_mode_builds_the_kernel_without_avx512(monkeypatch):
    """bench_trl.py --isa avx2 holds torch and oneDNN at AVX2 on an AVX-512 CPU; the kernel must be held too, or
    the bench measures an AVX-512 decode kernel beside AVX2 matmuls (the flags are part of the build's cache key)."""
    from thinkrl.accel import decode_kernel

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert decode_kernel._march() == ["-march=native"]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert decode_kernel._march() == ["-march=native", "-mno-avx512f"]
