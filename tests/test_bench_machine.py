"""bench/machine.py and bench_trl.py --isa: the machine record every bench result carries (CPU model, the ISA
torch and oneDNN run at), and the held-AVX2 environment the bench's workers get. No bench is run here: the
record's probe is one short subprocess per call."""

import json
import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bench_trl  # noqa: E402
import machine  # noqa: E402


def _unheld() -> dict:
    return {k: v for k, v in os.environ.items() if k not in machine.HELD_AVX2}


def test_machine_record_has_every_field_with_sane_types():
    import torch

    m = machine.machine(_unheld())
    assert isinstance(m["cpu"], str) and m["cpu"] and isinstance(m["vendor"], str)
    assert set(m["flags"]) == {"avx2", "fma", "avx512f", "avx512_bf16", "amx"}
    assert all(isinstance(v, bool) for v in m["flags"].values())
    assert m["torch_capability"] == torch.backends.cpu.get_cpu_capability()  # this process is not held either
    if torch.backends.mkldnn.is_available():
        assert isinstance(m["onednn_isa"], str) and m["onednn_isa"]  # parsed from oneDNN's own info line
    assert m["isa_env"] == {} and machine.label(m) == "native ISA"
    assert isinstance(m["cores"], int) and 1 <= m["usable_cores"] <= m["cores"]
    assert isinstance(m["torch_threads"], int) and m["torch_threads"] >= 1
    assert set(m["thread_env"]) == {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}
    assert m["torch"] == torch.__version__ and isinstance(m["transformers"], str)
    json.dumps(m)  # goes into result JSONs as it is
    line = machine.describe(m)
    assert m["cpu"] in line and f"torch CPU capability {m['torch_capability']}" in line and "native ISA" in line


def test_held_mode_is_what_every_worker_gets(monkeypatch):
    base = {"PATH": "/usr/bin", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    held = bench_trl.worker_env("avx2", base)
    assert {k: held[k] for k in machine.HELD_AVX2} == machine.HELD_AVX2 and held["PATH"] == "/usr/bin"
    assert bench_trl.worker_env("native", base)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"  # native: the environment as it is
    assert not set(machine.HELD_AVX2) & set(bench_trl.worker_env("native", {"PATH": "/usr/bin"}))

    seen = []

    def fake_run(cmd, env, **_):  # the worker subprocess, not run: its command and environment recorded
        seen.append((cmd, env))
        Path(cmd[cmd.index("--json") + 1]).write_text("{}")
        return type("Done", (), {"returncode": 0, "stderr": ""})()

    monkeypatch.setattr(bench_trl.subprocess, "run", fake_run)
    bench_trl._worker("thinkrl", ["--max-new-tokens", "8"], "avx2")
    bench_trl._worker("trl", [], "native")
    (cmd, env), (_, native) = seen
    assert cmd[1:4] == [bench_trl.__file__, "--worker", "thinkrl"] and cmd[-2:] == ["--max-new-tokens", "8"]
    assert all(env[k] == v for k, v in machine.HELD_AVX2.items()) and machine.held(env)
    assert all(native.get(k) == os.environ.get(k) for k in machine.HELD_AVX2)


def test_held_environment_reaches_torch_and_onednn():
    m = machine.machine(bench_trl.worker_env("avx2", _unheld()))
    assert m["isa_env"] == machine.HELD_AVX2 and machine.label(m) == "ISA held at AVX2"
    assert "ISA held at AVX2: ONEDNN_MAX_CPU_ISA=AVX2" in machine.describe(m)
    if m["flags"]["avx2"]:  # a CPU with AVX2 runs at exactly AVX2 when held, whatever more it has
        import torch

        assert m["torch_capability"] == "AVX2"
        if torch.backends.mkldnn.is_available():
            assert "AVX2" in m["onednn_isa"] and "512" not in m["onednn_isa"]


def test_both_runs_the_held_pass_with_the_same_settings_into_a_sibling_file():
    argv = ["--lengths", "64,256", "--isa", "both", "--out", "bench/RESULTS.md", "--steps", "2"]
    assert bench_trl.held_argv(argv, "bench/RESULTS.md") == [
        "--lengths", "64,256", "--steps", "2", "--isa", "avx2", "--out", "bench/RESULTS-avx2.md",
    ]  # fmt: skip
    assert bench_trl.held_argv(["--isa=both", "--group", "4"], "x/R.md") == ["--group", "4", "--isa", "avx2", "--out", "x/R-avx2.md"]
