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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MMAP_THRESHOLD = 4 * 2**20  # bytes: fixed, where glibc would let it grow to 32 MiB
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_done: list[bool] = []


def tune() -> bool:
    """Set the threshold once per process; True when glibc took it (False: left as it was)."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux") and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
            ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        except (OSError, AttributeError):  # no libc to load, or one without mallopt (musl)
            ok = False
    _done.append(ok)
    return ok
