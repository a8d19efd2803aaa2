"""Which machine a bench number came from: CPU model and flags, the ISA torch and oneDNN actually use, cores,
threads and versions. The same 2-core VM type comes with and without AVX-512, and thinkrl's oneDNN-packed
matmuls run at different speeds on each, so a step time without its ISA cannot be compared with another.

    python bench/machine.py        # one line (describe), then the whole record as JSON
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys

# What --isa avx2 sets: oneDNN's kernels, ATen's vectorised kernels and MKL's GEMM all stop at AVX2, so an
# AVX-512 machine runs the code paths an AVX2-only machine would.
HELD_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

# In a fresh interpreter: torch reads ATEN_CPU_CAPABILITY and oneDNN its ISA once per process, and oneDNN prints
# its ISA (the `isa:` info line) only at its first primitive and only with ONEDNN_VERBOSE set.
_PROBE = """
import json, torch
torch.randn(4, 4).to_mkldnn() if torch.backends.mkldnn.is_available() else None  # a oneDNN reorder: its info lines
print("PROBE " + json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}))
"""


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields}


def _probe(env: dict) -> dict:
    """torch's capability and threads, and oneDNN's ISA, as a fresh process with this environment gets them."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], env={**env, "ONEDNN_VERBOSE": "1"}, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict = {}
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE "):
            out.update(json.loads(line[6:]))
        elif "verbose," in line and ",isa:" in line:  # onednn_verbose,v1,info,cpu,isa:Intel AVX2 (dnnl_verbose before v3)
            out["onednn_isa"] = line.split(",isa:", 1)[1].strip()
    return out


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(env: dict | None = None) -> dict:
    """The record of this machine, for a process started with `env` (default: this process's environment)."""
    env = dict(os.environ if env is None else env)
    info, probe = _cpuinfo(), _probe(env)
    flags = set(info.get("flags", "").split())
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "vendor": info.get("vendor_id", ""),
        "flags": {**{f: f in flags for f in FLAGS}, "amx": any(f.startswith("amx") for f in flags)},
        "torch_capability": probe.get("capability"),
        "onednn_isa": probe.get("onednn_isa"),
        "isa_env": {k: env[k] for k in HELD_AVX2 if env.get(k)},
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": probe.get("threads"),
        "thread_env": {k: env.get(k) for k in THREAD_ENV},
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
    }


def held(env) -> bool:
    """Whether this environment holds the ISA at AVX2 (every variable of HELD_AVX2 set to its value)."""
    return all(env.get(k) == v for k, v in HELD_AVX2.items())


def label(m: dict) -> str:
    """Native or held, for a table's title (describe names the variables)."""
    return "ISA held at AVX2" if held(m["isa_env"]) else "ISA held" if m["isa_env"] else "native ISA"


def describe(m: dict) -> str:
    """One line for a results header: CPU model and flags, cores, the ISA torch and oneDNN use, held or native."""
    flags = " ".join(f for f, on in m["flags"].items() if on) or "no AVX2"
    cores = f"{m['usable_cores']} of {m['cores']} cores" if m["usable_cores"] != m["cores"] else f"{m['cores']} cores"
    held_at = " ".join(f"{k}={v}" for k, v in m["isa_env"].items())
    threads = ", ".join(f"{k}={v}" for k, v in m["thread_env"].items() if v)
    return (
        f"{m['cpu']} [{flags}], {cores}, torch CPU capability {m['torch_capability']}, oneDNN ISA {m['onednn_isa']} "
        f"({label(m)}{': ' + held_at if held_at else ''}); torch {m['torch']} with {m['torch_threads']} threads"
        + (f" ({threads})" if threads else "")
    )


if __name__ == "__main__":
    record = machine()
    print(describe(record))
    print(json.dumps(record, indent=2))
