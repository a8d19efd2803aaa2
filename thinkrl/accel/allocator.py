"""Where large CPU buffers come from: glibc's malloc, told once at start-up to hand every buffer of 4 MiB or
more straight to the kernel (mmap), which takes it back on free, and a cache of freed blocks of 1 MiB or more
(cpu_cache.cpp, built by native.py on first use) in front of torch's CPU allocator.

Why: with glibc's defaults its mmap threshold rises as large blocks are freed, so a training pass's
activations come from a heap that fragments and keeps growing; the fixed threshold stops that, and the cache
gives back the zero-filled pages it costs, since a training pass asks for the same sizes layer after layer.
The cache keeps at most CACHE_MAX, never more than CACHE_SLACK above the phase's own high-water mark, and is
emptied at the end of every generation and update phase. Neither changes a number
(tests/test_memory_defaults.py). THINKRL_CPU_CACHE=0 leaves torch's allocator alone, as does a machine with
CUDA; a user's own MALLOC_MMAP_THRESHOLD_ wins; elsewhere (not Linux, not glibc) this is a no-op. The
measurements that chose these numbers: docs/benchmarks.md.
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
