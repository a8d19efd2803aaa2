"""Building thinkrl's two small native helpers on first use: the lean decoder's attention kernel
(thinkrl/accel/decode_attention.c) and the CPU block cache (cpu_cache.cpp, see allocator.py).

Each is compiled with the system compiler into $THINKRL_CACHE/native (default ~/.cache/thinkrl/native), once
per source, compiler, flags and whatever else the caller names (the CPU for -march=native, torch's version
for code against its headers), then loaded with ctypes. A build takes about a second. Where it cannot be
built (not Linux, no compiler, a compile error) the caller gets None and one line on stderr naming the reason
and the switch that turns the helper off; thinkrl then runs the plain torch path, only slower. Without a
compiler that line says how to get one and is printed once per process, not once per helper.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from thinkrl.models import cache_dir


def compiler(env: str, *names: str) -> str | None:
    """$env if set, else the first of `names` on PATH."""
    return os.environ.get(env) or next((found for n in names if (found := shutil.which(n))), None)


def build(name: str, switch: str, source: Path, cc: str | None, compile_flags: list[str], link_flags: list[str], key: list[str]):
    """ctypes handle of `source` compiled with `cc`, built if needed; None (after a warning naming `switch`, the
    setting that turns the helper off) where it cannot be."""
    if not sys.platform.startswith("linux"):
        return None
    if cc is None:
        return unavailable(name, switch, "none on PATH", no_compiler=True)
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return unavailable(name, switch, f"{cc} --version failed: {getattr(e, 'strerror', None) or e}", no_compiler=True)
    parts = [source.read_text(), version, *compile_flags, *link_flags, *key]
    target = cache_dir() / "native" / f"{source.stem}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}.so"
    if not target.is_file():
        try:
            _compile(cc, source, compile_flags, link_flags, target)
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or e
            return unavailable(name, switch, f"compiling {source.name} with {cc} failed: {str(detail).strip()[-800:]}")
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        return unavailable(name, switch, f"loading {target} failed: {e}")


def _compile(cc: str, source: Path, compile_flags: list[str], link_flags: list[str], target: Path) -> None:
    """Compile to an object, then link separately: the link gets only `link_flags` (linking with -ffast-math,
    say, can add start-up code that changes the whole process's float mode). Written under a temporary name
    and renamed, so processes building at once never load a half-written file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "x.o", Path(tmp) / "x.so"
        run = dict(check=True, capture_output=True, text=True, timeout=300)
        subprocess.run([cc, *compile_flags, "-fPIC", "-c", str(source), "-o", str(obj)], **run)
        subprocess.run([cc, "-shared", str(obj), "-o", str(lib), *link_flags], **run)
        os.replace(lib, target)


_told_no_compiler: list[bool] = []  # the no-compiler line is printed once per process, whichever helper meets it


def unavailable(name: str, switch: str, why: str, no_compiler: bool = False) -> None:
    """One line on stderr (a warnings.warn would add its source line and repeat per helper); None."""
    if no_compiler:
        if _told_no_compiler:
            return None
        _told_no_compiler.append(True)
        line = (
            f"warning: thinkrl: no C/C++ compiler ({why}), so the {name} is unavailable, as is any other native CPU "
            "helper that needs one: training and sampling on the CPU run slower. Install one (Debian/Ubuntu: apt install "
            "build-essential; Fedora: dnf install gcc gcc-c++) or point CC and CXX at one; or set THINKRL_CPU_CACHE=0 "
            "and THINKRL_DECODE_KERNEL=0 to run without them and without this warning."
        )
    else:
        line = (
            f"warning: thinkrl: the {name} is unavailable ({' '.join(why.split())}); thinkrl runs without it, only slower "
            f"on the CPU. Set {switch} to run without it and without this warning."
        )
    print(line, file=sys.stderr, flush=True)
    return None
