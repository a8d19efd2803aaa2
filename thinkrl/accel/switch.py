"""THINKRL_ACCEL=0 turns every CPU speed-up off: the plain torch path, as a GPU runs it.

Read at each call, so a test (or a user) can set it per process; each speed-up also keeps its own switch
(THINKRL_CPU_CACHE, THINKRL_DECODE_KERNEL) for measuring one at a time.
"""

import os


def enabled() -> bool:
    return os.environ.get("THINKRL_ACCEL", "1") != "0"
