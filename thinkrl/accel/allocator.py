"""Where large CPU buffers come from: glibc's malloc, told once at start-up to hand every buffer of 4 MiB or
more straight to the kernel (mmap), which takes it back on free.

Why: by default glibc raises its mmap threshold each time a large mmap'd block is freed (up to 32 MiB), so
after a few steps a training pass's activations (MBs each, freed in another order than they were allocated,
with small long-lived tensors in between) come from the heap, which cannot shrink below its highest live
block and keeps growing. Measured on this project's 2-core machine (SmolLM2-135M, update phase, 4 x 1,024
completion tokens per pass, checkpointing on, and, in that measurement, packed copies of both W and W^T of
the frozen base): peak RSS 5.2 GB with glibc's defaults, 3.7 GB at 4 MiB, 3.1 GB at 128 KiB, the loss the
same to the bit. The threshold is not lower because every mmap'd buffer
is zero-filled by the kernel page by page on first touch: at 128 KiB or 1 MiB the 64-token update phase,
whose activations are 1-3 MB, took 11-12 s instead of 7. A user's own MALLOC_MMAP_THRESHOLD_ wins;
elsewhere (not Linux, not glibc) this is a no-op.

The price, measured later (update phase alone, 16 completions, fused LoRA layers, one run each): at 256
tokens, whose activations are 5-13 MB, 47 s at 4 MiB against 36-39 s with glibc's defaults (peak RSS 2.7 vs
3.7 GB); at 1,024 tokens 218 s against 181 s (2.9 vs 5.2 GB). With the defaults at 1,024 tokens malloc held
only 1.8 GB in use at its peak and 2.6 GB free inside the heap: the growth is fragmentation, not live
tensors. Trimming the heap (malloc_trim) between decoder layers brought that peak to 4.6 GB, not enough to
replace the threshold.

So, on top of the threshold, a cache of freed blocks of 1 MiB or more sits in front of torch's CPU allocator
(cpu_cache.cpp, built by thinkrl/accel/native.py on first use): a training pass frees and asks again for the same
sizes layer after layer, and the cache hands a freed block back instead of fresh pages, at most 512 MiB kept,
emptied at the end of every generation and every update phase. Measured (update phase alone, 16 completions,
this module's threshold both times, same hour; a first version of the cache with the same sizes): at 1,024
tokens 181.3 s at 2.91 GB peak RSS without the cache, 147.7 s at 2.98 GB with it (one run each); at 64 tokens
6.8-7.2 s / 3.18-3.38 GB without, 6.4-7.0 s / 3.02-3.13 GB with (three updates each). This file as it is: 256
tokens 36.2-41.4 s / 2.63-2.77 GB without, 28.2-28.9 s / 2.74-2.83 GB with (two updates each). It changes no
number (tests/test_memory_defaults.py). THINKRL_CPU_CACHE=0 leaves torch's allocator alone, as does a machine
with CUDA; without a C++ compiler or torch's headers it is skipped with one warning.

What it keeps is also bounded by the phase's own high-water mark: the cache's blocks in use plus kept never
stand more than CACHE_SLACK above the most that has been in use at once since the phase began, so a new mark
gives kept blocks back first and the cache does not raise the phase's peak. Measured (three checkpointed
4 x 1,024-token training passes in one phase, one process each, the cache's own counters): blocks held at
the peak 1,649 MB unbounded against 1,399 MB with the bound (1,336 MB in use), 30.8-35.9 s against
32.5-35.0 s a pass; the process's peak RSS 2.76 against 2.66-2.68 GB (freed blocks under the 4 MiB threshold
go back to glibc's heap, not always to the system). A whole 16 x 1,024-token step: 3,342 against 3,279 MB.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from thinkrl.accel import native

MMAP_THRESHOLD = 4 * 2**20  # bytes: fixed, where glibc would let it grow to 32 MiB
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
CACHE_MIN = 2**20  # bytes: blocks at least this large go through the cache
CACHE_MAX = 2**29  # bytes: the most the cache keeps
CACHE_SLACK = 2**26  # bytes: how far the cache's blocks in use plus kept may stand above the phase's most in use
_done: list[bool] = []
_cache: list = []  # [the cache library, or None where it is off or could not be built]


def tune() -> bool:
    """Set the threshold and start the block cache, once per process; True when glibc took the threshold
    (False: left as it was)."""
    if _done:
        return _done[0]
    _start_cache()
    ok = False
    if sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
            ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        except (OSError, AttributeError):  # no libc to load, or one without mallopt (musl)
            ok = False
    _done.append(ok)
    return ok


def release() -> None:
    """Free every block the cache keeps (the end of a phase: the next one allocates other sizes)."""
    if _cache and _cache[0] is not None:
        _cache[0].thinkrl_cache_empty()


@contextlib.contextmanager
def phase() -> Iterator[None]:
    """A phase (generation, an update) whose freed blocks are of no use to the next: emptied after it."""
    try:
        yield
    finally:
        release()


STATS = ("kept_bytes", "hits", "misses", "blocks", "in_use_peak", "held_peak")


def cache_stats() -> dict[str, int] | None:
    """Bytes kept, hits, misses and blocks made so far, and since the last release() the most bytes of the
    cache's blocks in use and the most in use plus kept; None without the cache."""
    if not _cache or _cache[0] is None:
        return None
    out = (ctypes.c_size_t * len(STATS))()
    _cache[0].thinkrl_cache_stats(out)
    return dict(zip(STATS, out))


def _start_cache() -> None:
    if _cache:
        return
    import torch

    lib = None  # a CUDA machine trains and decodes on the GPU: its CPU allocations are few and small
    if sys.platform.startswith("linux") and os.environ.get("THINKRL_CPU_CACHE", "1") != "0" and not torch.cuda.is_available():
        root = Path(torch.__file__).parent
        flags = ["-O2", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-I{root / 'include'}"]
        link = [f"-L{root / 'lib'}", "-lc10", f"-Wl,-rpath,{root / 'lib'}"]
        source = Path(__file__).with_name("cpu_cache.cpp")
        lib = native.build(
            "CPU block cache",
            "THINKRL_CPU_CACHE=0",
            source,
            native.compiler("CXX", "c++", "g++"),
            flags,
            link,
            [torch.__version__, str(root)],
        )
        if lib is not None:
            lib.thinkrl_cache_install.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t]
            lib.thinkrl_cache_stats.argtypes = [ctypes.c_void_p]
            lib.thinkrl_cache_stats.restype = None
            lib.thinkrl_cache_empty.restype = None
            if lib.thinkrl_cache_install(CACHE_MIN, CACHE_MAX, CACHE_SLACK) not in (0, 1):
                lib = None  # torch's allocator is not one the cache can stand in front of: left alone
    _cache.append(lib)
