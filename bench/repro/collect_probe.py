"""Copy a probe from bench/repro/runs/probe-NAME into bench/repro/results/probes/NAME: probe.json (every start's
raw replicates and its starting point) and probe.md once every start has run, else the start records on disk
(start-K.json: bench/repro/run_probes.sh puts them back, so a later session runs only the starts missing); and
cpu.json, the CPU time of those starts as run_probes.sh recorded them (cpu.log), with the machine.

    python bench/repro/collect_probe.py NAME [NAME ...]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from machine import describe, machine  # noqa: E402

LINE = re.compile(r"start (\d+) user ([\d.]+) sys ([\d.]+) wall ([\d.]+) commit (\w+) threads (\d+)")


def collect(name: str) -> None:
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
        "machine": describe(machine({**os.environ, "OMP_NUM_THREADS": "1"})) + "; two 1-thread probe queues side by side",
        "command": f"bash bench/repro/run_probes.sh {name} (each start: thinkrl probe bench/repro/probes/{name}.yaml --only-start K)",
        "note": "per start, as /usr/bin/time reported it; the start runs (grpo, 5 steps, seeds 0-4) were trained once "
        "into bench/repro/runs/starts and copied into every probe: their time is not in here",
        "starts": {str(k): starts[k] for k in sorted(starts)},
    }
    (out / "cpu.json").write_text(json.dumps(cpu, indent=1) + "\n")
    print(f"{out}: {len(done)} starts{'' if whole else ' (not all: start records)'}, {(cpu['user_s'] + cpu['sys_s']) / 60:.0f} CPU min")


if __name__ == "__main__":
    for n in sys.argv[1:]:
        collect(n)
