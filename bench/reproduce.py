"""Reproduce each seed paper's claim in miniature: per claim a method and its baselines, trained in the same
regime on the same prompts (same data and train.seed per seed index) for the same steps, 3 seeds per arm,
each run evaluated greedily on the same 200 held-out problems. docs/reproductions-3seed.md has the tables
(superseded by the powered rows of docs/reproductions.md: bench/repro/probes, bench/repro/studies).

    python bench/reproduce.py                        # the whole grid (hours on 2 CPU cores; resumable)
    python bench/reproduce.py --claims ctpo,ais      # some rows
    python bench/reproduce.py --report               # docs/reproductions-3seed.md from bench/repro/results/ only
    python bench/reproduce.py --smoke --claims ctpo  # 2 steps, 1 seed, 8 eval problems, into a temporary directory

Resumable: a run whose result JSON exists is skipped; a run directory with a config continues with
`thinkrl train --resume` (it restarts from its newest checkpoint, every 10 steps and at a Ctrl-C); an
interrupted eval reruns and keeps its finished samples. Ctrl-C is passed on to thinkrl once per press:
the first finishes and checkpoints the current step, then the driver stops.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402
from repro_claims import CLAIMS  # noqa: E402
from repro_report import HEADER, SEEDS_NEEDED, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMON = ("train.save_every=10",)  # a hard kill loses at most 10 steps (Ctrl-C only the current one); results do not depend on it
SMOKE = ("train.steps=2", "rollout.group_size=4", "rollout.max_new_tokens=16", "data.limit=16")
EVAL_LIMIT, SMOKE_LIMIT = 200, 8
TRACE_KEYS = (
    "step", "reward/mean", "entropy", "grad_norm", "length/mean", "frac_reward_zero_std", "update/optimizer_steps",
    "mismatch/abs_log_ratio", "mismatch/k3", "mismatch/ratio_gt2_frac", "answers/distinct_per_group", "clip/frac",
    "correction/weight_mean", "sis/accept_frac", "ais/alpha", "stare/reweighted_frac", "seeds/seeded_frac", "time/step",
)  # fmt: skip


def overrides(name: str, arm: str, seed: int | str) -> list[str]:
    claim = CLAIMS[name]
    return [*claim.regime, *claim.arms[arm][1], f"train.steps={claim.steps}", *COMMON, f"train.seed={seed}"]


def run_dirs(runs: Path) -> dict[tuple[str, str], Path]:
    """(claim, arm) -> its runs' parent directory; arms of different claims with the same method and overrides
    (sis's and drpo's grpo) share one, so each such run trains once."""
    owner: dict[str, Path] = {}
    out = {}
    for name, claim in CLAIMS.items():
        for arm, (method, _) in claim.arms.items():
            out[name, arm] = owner.setdefault(json.dumps([method, overrides(name, arm, 0)]), runs / f"{name}-{arm}")
    return out


def train_args(name: str, arm: str, seed: int | str, extra: list[str]) -> list[str]:
    return ["train", "--method", CLAIMS[name].arms[arm][0], *(x for o in [*overrides(name, arm, seed), *extra] for x in ("-o", o))]


def shown(args: list[str | Path]) -> str:
    return shlex.join(["thinkrl", *(os.path.relpath(a, ROOT) if isinstance(a, Path) else a for a in args)])


class Stopped(Exception):
    pass


def thinkrl(args: list[str | Path]) -> int:
    """Run `thinkrl ARGS` in its own session and pass each Ctrl-C / SIGTERM the driver gets to it exactly once:
    the first makes train finish its step and checkpoint, as in a terminal. subprocess.run would kill it."""
    print(f"\n$ {shown(args)}", flush=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "thinkrl", *map(str, args)], cwd=ROOT, env=env, start_new_session=True)
    got: list[int] = []

    def forward(sig, _frame) -> None:
        got.append(sig)
        proc.send_signal(sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if got:
        raise Stopped
    return rc


def provenance() -> dict:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "thinkrl_version": importlib.metadata.version("thinkrl"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        # torch's threads in the runs (OMP_NUM_THREADS, else one per core): summation order, so the last bits, depend on it
        "threads": int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1),
        "machine": machine.machine(),  # CPU model and the ISA torch and oneDNN ran at (bench/machine.py)
    }


def run_provenance(run: Path) -> dict:
    """The provenance of the run's training (add_wall keeps one record per training invocation): the last one's
    commit and version, the thread counts of all (one number when they agree). A result written later (another
    claim sharing the run, or the driver rerun after its JSON was removed) then describes the run, not the
    invocation that writes it. A run from before these records: this invocation's."""
    path = run / "repro-wall.json"
    records = json.loads(path.read_text()).get("trained", []) if path.is_file() else []
    if not records:
        return provenance()
    threads = sorted({r["threads"] for r in records})
    return {**records[-1], "threads": threads[0] if len(threads) == 1 else threads}


def add_wall(run: Path, key: str, seconds: float) -> dict:
    """Wall seconds spent on the run by every invocation of the driver (a resumed run adds up), and each
    training invocation's provenance (run_provenance)."""
    path = run / "repro-wall.json"
    if not run.is_dir():  # setup failed: thinkrl creates the run directory only once setup works
        return {}
    wall = json.loads(path.read_text()) if path.is_file() else {}
    wall[key] = round(wall.get(key, 0.0) + seconds, 1)
    if key == "train":
        wall["trained"] = [*wall.get("trained", []), provenance()]
    path.write_text(json.dumps(wall))
    return wall


def run_one(name: str, arm: str, seed: int, a: argparse.Namespace, dirs: dict) -> bool | None:
    """Train, evaluate and record one (claim, arm, seed): True when it wrote a result, None when one was there,
    False when a command failed."""
    out = a.results_dir / name / arm / f"seed-{seed}.json"
    if out.is_file():
        return None
    extra = [*(SMOKE if a.smoke else ()), *a.override] + ([f"model.name={a.model}"] if a.model else [])
    every = overrides(name, arm, seed) + extra
    steps = int([o for o in every if o.startswith("train.steps=")][-1].split("=", 1)[1])  # the last one wins, as in thinkrl
    run, limit = dirs[name, arm] / f"seed-{seed}", SMOKE_LIMIT if a.smoke else EVAL_LIMIT
    first = [*train_args(name, arm, seed, extra), "--output-dir", run]
    held = run / "eval" / f"step-{steps}" / "heldout"
    evaluate = ["eval", "--model", run, "--limit", str(limit), "--output", held]
    if not (run / "checkpoints" / f"step-{steps}").is_dir():
        t0 = time.perf_counter()
        rc = thinkrl(["train", "--resume", run, "-o", f"train.steps={steps}"] if (run / "config.yaml").is_file() else first)
        add_wall(run, "train", time.perf_counter() - t0)
        if rc or not (run / "checkpoints" / f"step-{steps}").is_dir():
            print(f"error: {shown(first)} ended (exit {rc}) without a step-{steps} checkpoint", file=sys.stderr)
            return False
    if not (held / "summary.json").is_file():
        t0 = time.perf_counter()
        rc = thinkrl(evaluate)
        add_wall(run, "eval", time.perf_counter() - t0)
        if rc:
            print(f"error: {shown(evaluate)} failed (exit {rc})", file=sys.stderr)
            return False
    wall = json.loads((run / "repro-wall.json").read_text()) if (run / "repro-wall.json").is_file() else {}
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((held / "summary.json").read_text())
    sig = lambda v: float(f"{v:.6g}") if isinstance(v, float) else v  # noqa: E731  (6 digits keep the JSON small)
    result = {
        "claim": name,
        "arm": arm,
        "seed": seed,
        "method": CLAIMS[name].arms[arm][0],
        "command": shown(first),
        "eval_command": shown(evaluate),
        **run_provenance(run),
        "wall_seconds": {k: v for k, v in wall.items() if k != "trained"},
        "train_seconds_logged": round(sum(m.get("time/step", 0.0) for m in metrics), 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "steps": len(metrics),
        "accuracy": {**{k: v for k, v in summary["metrics"].items() if k.startswith("avg@1")}, "problems": summary["problems"]},
        "eval_settings": {k: summary["settings"].get(k) for k in ("preset", "n", "temperature", "max_new_tokens", "split", "engine_used")},
        "trace": {k: [sig(m.get(k)) for m in metrics] for k in TRACE_KEYS if any(k in m for m in metrics)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claims", default=",".join(CLAIMS), help=f"comma-separated, of {', '.join(CLAIMS)}")
    ap.add_argument("--seeds", type=int, default=SEEDS_NEEDED, help="seeds per arm: train.seed 0 .. N-1")
    ap.add_argument("--runs-dir", type=Path, help="run directories (default bench/repro/runs; --smoke: a temporary one)")
    ap.add_argument("--results-dir", type=Path, help="result JSONs (default bench/repro/results; --smoke: under the runs dir)")
    ap.add_argument("--doc", type=Path, help="the report (default docs/reproductions-3seed.md; --smoke: under the runs dir)")
    ap.add_argument("--model", help="another model for every run (recorded in each command)")
    ap.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE added to every train command, after the claim's")
    ap.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, few problems, 8 eval problems (plumbing only)")
    ap.add_argument("--report", action="store_true", help="only write the report from the result JSONs")
    a = ap.parse_args()
    names = [c.strip() for c in a.claims.split(",") if c.strip()]
    unknown = [c for c in names if c not in CLAIMS]
    if unknown:
        ap.error(f"unknown claim {', '.join(unknown)}; choose from {', '.join(CLAIMS)}")
    if a.smoke:
        a.seeds = 1
        a.runs_dir = a.runs_dir or Path(tempfile.mkdtemp(prefix="thinkrl-repro-smoke-"))
    runs = (a.runs_dir or ROOT / "bench" / "repro" / "runs").resolve()
    a.results_dir = (a.results_dir or (runs / "results" if a.smoke else ROOT / "bench" / "repro" / "results")).resolve()
    doc = (a.doc or (runs / "reproductions.md" if a.smoke else ROOT / "docs" / "reproductions-3seed.md")).resolve()
    dirs = run_dirs(runs)

    def report() -> None:
        cmd = lambda name, arm: shown([*train_args(name, arm, "K", []), "--output-dir", dirs[name, arm] / "seed-K"])  # noqa: E731
        print(f"written: {write_report(CLAIMS, a.results_dir, doc, doc.parent / 'reproductions', cmd, HEADER)}")

    if a.report:
        return report()
    failed = []
    try:
        for name in names:  # claim by claim, so each row reaches 3 seeds (and a verdict) as early as it can
            for seed in range(a.seeds):
                for arm in CLAIMS[name].arms:
                    done = run_one(name, arm, seed, a, dirs)
                    if done is False:
                        failed.append(f"{name}/{arm}/seed-{seed}")
                    elif done:
                        report()  # after every new result, so the tables can be committed as they fill
    except Stopped:
        sys.exit("stopped: training checkpointed its current step (an eval keeps its samples); the same command continues the grid")
    report()
    print(f"runs: {runs}\nresults: {a.results_dir}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (the rest finished; the same command retries these)")


if __name__ == "__main__":
    main()
