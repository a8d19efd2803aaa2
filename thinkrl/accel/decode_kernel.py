"""The decode-step attention kernel (decode_attention.c): built with the system C compiler on first use,
loaded with ctypes, used by the lean decoder on float32 CPU tensors.

Why: in a decode step each row has a few query heads per key head and reads all of its keys and values once;
that read is the floor, and SDPA took 1.5-3x as long (docs/benchmarks.md). The kernel also applies the rotary
embedding and stores the new key and value. Each row's output depends on its own keys alone, so a row decodes
to the same bits whatever shares its step; against SDPA it differs by summation order (~3e-7).

Built by native.py once per source, compiler, flags and CPU (-march=native, without AVX-512 under
ATEN_CPU_CAPABILITY=avx2; $CC, else cc or gcc). Threads: OpenMP,
only when the process already runs torch's libgomp (a second OpenMP runtime would fight it for the cores),
else one thread. Where it cannot be built the decoder uses SDPA and says so once; THINKRL_DECODE_KERNEL=0
turns the kernel off.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import torch
from torch import Tensor

from thinkrl.accel import native

SOURCE = Path(__file__).with_name("decode_attention.c")
_loaded: list = []  # [the C function or None], filled by the first load()


def load():
    """The kernel's C function, building it if needed; None where it cannot be had (then SDPA is used)."""
    if not _loaded:
        _loaded.append(_build_and_load() if os.environ.get("THINKRL_DECODE_KERNEL", "1") != "0" else None)
    return _loaded[0]


def usable(storage: Tensor) -> bool:
    """Whether attention over this key/value storage can run in the kernel: float32 on the CPU."""
    return storage.device.type == "cpu" and storage.dtype == torch.float32 and storage.is_contiguous() and load() is not None


class DecodeStep:
    """The attention calls of one decode step (one per layer): each stores the new keys and values and
    attends. The positions, rotary tables, scratch and checks are prepared once per step, not once per layer."""

    def __init__(self, positions: Tensor, cos: Tensor, sin: Tensor, key_heads: int, group: int, scale: float | None = None) -> None:
        """positions (n,): where each row's new token goes (it then attends to positions + 1 stored
        positions); cos, sin (n, D): its rotary tables; `group` query heads share each of the `key_heads`;
        scores are scaled by `scale` (None: 1 / sqrt(D))."""
        self.positions = positions.to(device="cpu", dtype=torch.long).contiguous()  # (n,)
        n, D = cos.shape
        assert sin.shape == cos.shape and len(self.positions) == n and int(self.positions.min()) >= 0
        assert D % 2 == 0, "the rotate-half rotary embedding needs an even head dim"
        self.cos, self.sin = cos.float().contiguous(), sin.float().contiguous()
        self.Hk, self.G, self.D = key_heads, group, D
        self.scale = D**-0.5 if scale is None else scale
        self.longest = int(self.positions.max()) + 1
        self.scratch = torch.empty(n * key_heads * group * (D + self.longest))  # rotated queries, softmax rows
        self.fn = load()
        assert self.fn is not None, "check usable() first"

    def __call__(self, qkv: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """qkv (n, Hq + 2 Hk, D) before the rotary embedding; keys, values (S, Hk, C, D), S >= n, get row r's
        new key and value at positions[r].  -> (n, Hq, D) each query head's attention output."""
        n, Hk, G, D = len(self.positions), self.Hk, self.G, self.D
        qkv = qkv.contiguous()
        assert qkv.dtype == keys.dtype == values.dtype == torch.float32 and keys.is_contiguous() and values.is_contiguous()
        assert qkv.shape == (n, Hk * G + 2 * Hk, D), "qkv is (rows, query heads + 2 key heads, head dim)"
        assert keys.shape == values.shape and keys.shape[0] >= n and keys.shape[1] == Hk and keys.shape[3] == D
        assert self.longest <= keys.shape[2], "every new position must fit in the storage"
        out = qkv.new_empty((n, Hk * G, D))
        ptr = ctypes.c_void_p
        self.fn(
            ptr(qkv.data_ptr()), ptr(self.cos.data_ptr()), ptr(self.sin.data_ptr()), ptr(keys.data_ptr()), ptr(values.data_ptr()),
            ptr(out.data_ptr()), ptr(self.positions.data_ptr()), n, Hk, G, D, keys.shape[2], keys.stride(0), self.scale,
            ptr(self.scratch.data_ptr()), self.longest,
        )  # fmt: skip
        return out


def _openmp_flag() -> list[str]:
    """-fopenmp when torch's own libgomp is already in this process (the kernel's libgomp.so.1 then resolves
    to it: one thread pool), nothing otherwise."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return ["-fopenmp"] if "libgomp" in maps else []


def _cpu_id() -> str:
    """What -march=native depends on: the CPU's model and flags (the first processor's lines)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(next((x for x in lines if x.startswith(key)), "") for key in ("model name", "flags", "Features"))


def _march() -> list[str]:
    """-march=native, held to AVX2 where torch is (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU: the held-ISA mode of
    bench/bench_trl.py --isa avx2), so that the kernel runs the code an AVX2-only CPU would."""
    held = os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2"
    return ["-march=native", "-mno-avx512f"] if held else ["-march=native"]


def _build_and_load():
    omp = _openmp_flag()
    flags = ["-O3", *_march(), "-ffast-math", *omp]
    lib = native.build(
        "decode attention kernel", "THINKRL_DECODE_KERNEL=0", SOURCE, native.compiler("CC", "cc", "gcc"), flags, [*omp, "-lm"], [_cpu_id()]
    )
    if lib is None:
        return None
    fn = lib.decode_step
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_long] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_long]
    return fn
