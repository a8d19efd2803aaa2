"""Copy a probe from bench/repro/runs/probe-NAME into bench/repro/results/probes/NAME: probe.json (every start's
raw replicates and its starting point) and probe.md once every start has run, else the start records on disk
(start-K.json: bench/repro/run_probes.sh puts them back, so a later session runs only the starts missing); and
cpu.json, the CPU time of those starts as run_probes.sh recorded them (cpu.log), with the machine.

    python bench/repro/collect_probe.py NAME [NAME ...] [--beside "what else ran on the machine"]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from machine import describe, machine  # noqa: E402

LINE = re.compile(r"start (\d+) user ([\d.]+) sys ([\d.]+) wall ([\d.]+) commit (\w+) threads (\d+)")


def _shared(run: Path, k: int) -> bool:
    """Whether start k's start run was copied from bench/repro/runs/starts (run_probes.sh) rather than trained by
    the probe: a run's config.yaml keeps the directory it was trained into."""
    config = run / f"start-{k}" / "config.yaml"
    return config.is_file() and "runs/starts/" in (yaml.safe_load(config.read_text()).get("output_dir") or "")


def collect(name: str, beside: str = "two 1-thread probe queues side by side") -> None:
    run, out = ROOT / "bench/repro/runs" / f"probe-{name}", ROOT / "bench/repro/results/probes" / name
    records = sorted(run.glob("start-*.json"))
    done = [int(r.stem.removeprefix("start-")) for r in records]
    starts = {}
    for m in map(LINE.match, (run / "cpu.log").read_text().splitlines()):
        if m:  # a start run twice (interrupted, then again): its last run is the one on disk
            k, user, sys_, wall, commit, threads = m.groups()
            starts[int(k)] = {"user_s": float(user), "sys_s": float(sys_), "wall_s": float(wall), "commit": commit, "threads": int(threads)}
    missing = sorted(set(done) - set(starts))
    if missing:
        raise SystemExit(f"{run / 'cpu.log'}: no time recorded for start(s) {missing}")
    starts = {k: starts[k] for k in done}
    out.mkdir(parents=True, exist_ok=True)
    whole = (run / "probe.json").is_file() and json.loads((run / "probe.json").read_text())["starts"] == len(done)
    for f in [run / "probe.json", run / "probe.md"] if whole else records:
        shutil.copyfile(f, out / f.name)
    cpu = {
        "user_s": round(sum(s["user_s"] for s in starts.values()), 1),
        "sys_s": round(sum(s["sys_s"] for s in starts.values()), 1),
        "commits": sorted({s["commit"] for s in starts.values()}),
        "threads": sorted({s["threads"] for s in starts.values()}),
        "machine": describe(machine({**os.environ, "OMP_NUM_THREADS": "1"})) + f"; {beside}",
        "command": f"bash bench/repro/run_probes.sh {name} (each start: thinkrl probe bench/repro/probes/{name}.yaml --only-start K)",
        "note": "per start, as /usr/bin/time reported it; " + _start_runs_note(run, sorted(starts)),
        "starts": {str(k): starts[k] for k in sorted(starts)},
    }
    (out / "cpu.json").write_text(json.dumps(cpu, indent=1) + "\n")
    print(f"{out}: {len(done)} starts{'' if whole else ' (not all: start records)'}, {(cpu['user_s'] + cpu['sys_s']) / 60:.0f} CPU min")


def _start_runs_note(run: Path, ks: list[int]) -> str:
    shared = [k for k in ks if _shared(run, k)]
    own = [k for k in ks if k not in shared]
    parts = []
    if shared:
        copied = "were trained once into bench/repro/runs/starts and copied: their time is not in here"
        parts.append(f"the start runs of starts {shared} {copied}")
    if own:
        parts.append(f"the start runs of starts {own} were trained by the probe itself: their time is in here")
    return "; ".join(parts)


if __name__ == "__main__":
    args = sys.argv[1:]
    beside = args.pop(args.index("--beside") + 1) if "--beside" in args else None
    for n in (a for a in args if a != "--beside"):
        collect(n, *([beside] if beside else []))
