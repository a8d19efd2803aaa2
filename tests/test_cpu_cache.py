"""The CPU block cache (thinkrl/accel/cpu_cache.cpp, started by thinkrl/accel/allocator.py): freed large blocks are handed
back for requests of about their size, the kept total stays under its bound and is emptied between phases,
oneDNN's raw allocations and blocks made before it started go back where they came from, and where it cannot be
built thinkrl says so and goes on. Each case runs in a fresh process: the cache is process-wide for good."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from thinkrl.accel import allocator, native

pytestmark = [
    pytest.mark.usefixtures("accel_on"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the cache is built on Linux only"),
]


def run(body: str, **env: str) -> str:
    code = "import torch\nfrom thinkrl.accel import allocator\n" + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def needs_cache() -> None:
    if "CPU block cache is unavailable" in run("allocator.tune()"):
        pytest.skip("no C++ compiler or torch headers here to build the cache")


def test_freed_blocks_are_reused_for_requests_of_about_their_size():
    needs_cache()
    out = run(
        """
        allocator.CACHE_MIN, allocator.CACHE_MAX = 2**20, 64 * 2**20
        before = torch.randn(1000)  # from torch's own allocator: freed through it later
        assert allocator.tune() is not None
        assert allocator.cache_stats() == dict(kept_bytes=0, hits=0, misses=0, blocks=0, in_use_peak=0, held_peak=0)
        a = torch.empty(2**20 + 2**16)  # 4.25 MiB
        del a
        assert allocator.cache_stats()["kept_bytes"] == 4 * 2**20 + 2**18
        b = torch.empty(2**20)  # 4 MiB: the kept block, 1/16 larger, serves it
        s = allocator.cache_stats()
        assert (s["hits"], s["misses"], s["kept_bytes"]) == (1, 1, 0), s
        del b
        c = torch.empty(2**21)  # 8 MiB: larger than anything kept, a new block; the 4.25 MiB one stays kept
        s = allocator.cache_stats()
        assert (s["hits"], s["misses"], s["kept_bytes"]) == (1, 2, 4 * 2**20 + 2**18), s
        del c
        d = torch.empty(2**19)  # 2 MiB: the kept blocks would waste more than 1/8, so a new one
        assert allocator.cache_stats()["misses"] == 3
        small = torch.ones(10)  # under CACHE_MIN: torch's allocator, uncounted
        del small, before
        assert allocator.cache_stats()["misses"] == 3
        d.fill_(3.0)
        assert float(d.sum()) == 3.0 * 2**19
        print("OK")
        """
    )
    assert "OK" in out


def test_the_kept_total_stays_under_its_bound_and_empties_between_phases():
    needs_cache()
    out = run(
        """
        allocator.CACHE_MIN, allocator.CACHE_MAX = 2**20, 10 * 2**20
        allocator.tune()
        blocks = [torch.empty(2**20 * k) for k in (1, 1, 2)]  # 4 + 4 + 8 MiB
        del blocks
        s = allocator.cache_stats()
        assert s["kept_bytes"] <= 10 * 2**20 and s["kept_bytes"] == 8 * 2**20, s  # the 8 MiB block was given back
        with allocator.phase():
            x = torch.empty(2**20)
            del x
            assert allocator.cache_stats()["kept_bytes"] == 8 * 2**20
        assert allocator.cache_stats()["kept_bytes"] == 0
        print("OK")
        """
    )
    assert "OK" in out


def test_kept_blocks_never_raise_a_phase_above_its_own_high_water_mark():
    """What the cache keeps fits in the room below the most the phase has had in use (plus CACHE_SLACK): a new
    high-water mark gives kept blocks back first, so the cache does not add to a phase's peak memory."""
    needs_cache()
    out = run(
        """
        MiB = 2**20
        allocator.CACHE_MIN, allocator.CACHE_MAX, allocator.CACHE_SLACK = MiB, 64 * MiB, 2 * MiB
        allocator.tune()
        def check(kept, in_use_peak):
            s = allocator.cache_stats()
            assert (s["kept_bytes"], s["in_use_peak"]) == (kept * MiB, in_use_peak * MiB), s
            assert s["held_peak"] <= s["in_use_peak"] + 2 * MiB, s
        a = torch.empty(2 * MiB)  # 8 MiB in use: the phase's mark
        del a
        check(kept=8, in_use_peak=8)  # kept: 0 in use + 8 kept is no more than the mark
        b = torch.empty(4 * MiB)  # 16 MiB, a new block and a new mark: the kept 8 would stand 8 above it
        check(kept=0, in_use_peak=16)
        c = torch.empty(MiB)  # 4 MiB more in use: 20
        del c, b
        check(kept=20, in_use_peak=20)  # both kept: nothing in use, 20 kept
        d = torch.empty(8 * MiB)  # 32 MiB: no kept block fits; all 20 go back before it is made
        check(kept=0, in_use_peak=32)
        assert allocator.cache_stats()["held_peak"] == 32 * MiB
        del d
        check(kept=32, in_use_peak=32)
        allocator.release()  # the end of a phase: the next starts from what is in use then (nothing) as its mark
        check(kept=0, in_use_peak=0)
        e = torch.empty(MiB)
        del e
        check(kept=4, in_use_peak=4)
        print("OK")
        """
    )
    assert "OK" in out


def test_onednn_blocks_and_autograd_run_through_the_cache_with_the_same_numbers():
    needs_cache()
    out = run(
        """
        from thinkrl.accel.packed import PackedLinear
        allocator.CACHE_MIN = 0  # every block through the cache
        g = torch.Generator().manual_seed(0)
        w, x = torch.randn(512, 256, generator=g), torch.randn(600, 256, generator=g, requires_grad=True)
        def compute():
            y = PackedLinear(w, None, 600)(x.detach())  # oneDNN's reorder allocates through the raw interface
            loss = (torch.nn.functional.gelu(x @ w.t()) ** 2).sum()
            (grad,) = torch.autograd.grad(loss, x)
            return y, grad
        plain = compute()
        allocator.tune()
        for _ in range(3):  # blocks freed by one round serve the next
            cached = compute()
            assert all(torch.equal(a, b) for a, b in zip(plain, cached))
        assert allocator.cache_stats()["hits"] > 0
        del plain  # made before the cache started: freed by torch's allocator through the cache's deleter
        print("OK")
        """
    )
    assert "OK" in out


def test_switched_off_or_unbuildable_the_cache_is_skipped(tmp_path, monkeypatch, capsys):
    assert "None" in run("allocator.tune(); print(allocator.cache_stats())", THINKRL_CPU_CACHE="0")
    monkeypatch.setattr(allocator, "_cache", [])
    monkeypatch.setattr(native, "_told_no_compiler", [])  # said once per process: maybe said already in this one
    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-cxx"))
    allocator._start_cache()
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and err.count("\n") == 1, err
    assert all(part in err for part in ("CPU block cache is unavailable", "no-such-cxx", "THINKRL_CPU_CACHE=0")), err
    assert allocator._cache == [None] and allocator.cache_stats() is None
    assert not list(tmp_path.rglob("*.so"))
    assert native.compiler("CXX", "c++") == str(tmp_path / "no-such-cxx")


def test_without_a_compiler_one_line_says_what_is_slower_and_how_to_get_one(tmp_path):
    """Both native helpers fail to build: one line on stderr for the process, no Python warning with its source line."""
    code = "import torch\nfrom thinkrl.accel import allocator, decode_kernel\nallocator.tune()\nprint(decode_kernel.load())"
    env = {**os.environ, "THINKRL_CACHE": str(tmp_path), "CC": str(tmp_path / "no-cc"), "CXX": str(tmp_path / "no-cxx")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: thinkrl: no C/C++ compiler"), proc.stderr
    assert "CPU block cache is unavailable" in lines[0] and "run slower" in lines[0] and "apt install build-essential" in lines[0]
    assert "Warning:" not in proc.stderr and "native.build(" not in proc.stderr
