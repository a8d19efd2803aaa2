"""A probe's independent starting points, run one after another or as separate jobs.

Start k takes seed + k for everything a single probe holds fixed: its starting policy (a probe file trains
one per start, into OUTPUT/start-k), its stale batch, its reference draw and its replicates. Each start's
measurements go to OUTPUT/start-k.json as soon as it finishes, with a fingerprint of the inputs, so an
interrupted probe loses only the start it was on, `--only-start K` lets starts run as background jobs, and a
record measured under other inputs (an edited probe file, other settings) is refused instead of mixed in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from thinkrl.errors import UserError
from thinkrl.probe.measure import ProbeSettings, as_arm
from thinkrl.probe.report import RENYI, summarise, write
from thinkrl.probe.spec import ProbeFile, train_start
from thinkrl.run.atomic import write_atomic
from thinkrl.run.console import console


def fingerprint(ps: ProbeSettings, pf: ProbeFile | None, regime: dict[str, Any]) -> str:
    """What a start's numbers depend on besides its index: the probe file's bytes, the settings (all but the
    number of starts: adding starts keeps the ones measured) and the regime given on the command line, with
    the contents of a --config file."""
    config = regime.get("config")
    parts = {
        "file": pf.digest if pf else None,
        "settings": {k: v for k, v in asdict(ps).items() if k != "starts"},
        "regime": {k: str(v) for k, v in regime.items()},
        "config": hashlib.sha256(Path(config).read_bytes()).hexdigest() if config else None,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_starts(output: Path, ps: ProbeSettings, pf: ProbeFile | None, regime: dict[str, Any], only: int | None) -> None:
    """Run the starts not on disk yet (or start `only`), then, unless `only`, write probe.json and probe.md."""
    from_run = _from_run(regime.get("from"))  # a bad --from: before any start runs
    fp = fingerprint(ps, pf, regime)
    renyi = pf is not None and any(k in RENYI for k in pf.primary)
    records: dict[int, dict] = {}
    for k in range(ps.starts):
        rec = _read(output / f"start-{k}.json", fp)
        if rec is None and only in (None, k):
            rec = _run_one(output, ps, pf, regime, from_run, k, renyi)
            write_atomic(output / f"start-{k}.json", json.dumps({**rec, "fingerprint": fp}, allow_nan=False) + "\n")
        if rec is not None:
            records[k] = rec
    if only is not None:
        left = ps.starts - len(records)
        tail = (
            f"{left} of {ps.starts} still to run (--only-start K each)"
            if left
            else "all there: run it again without --only-start to summarise"
        )
        console.print(f"probe: start {only} is in {output / f'start-{only}.json'}; {tail}")
        return
    _report(output, ps, pf, [records[k] for k in range(ps.starts)])


def _from_run(start: Path | None) -> tuple[Path, Path] | None:
    """(run_dir, checkpoint) of --from, checked up front."""
    from thinkrl.run.intact import find_checkpoint

    if start is None:
        return None
    found = find_checkpoint(str(start))
    if found is None:
        raise UserError(f"--from {start}: not a run directory or RUN_DIR/checkpoints/step-N")
    return found


def _read(path: Path, fp: str) -> dict | None:
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{path}: not a readable start record (an interrupted write?); delete it and run the probe again") from None
    if rec.get("fingerprint") != fp:
        raise UserError(
            f"{path} was measured with other inputs (the probe file, its settings or the regime changed since); "
            "move it away or give another --output"
        )
    return rec


def _run_one(output: Path, ps: ProbeSettings, pf: ProbeFile | None, regime: dict, from_run, k: int, renyi: bool) -> dict:
    """Start k: its starting policy (trained from a probe file, or --from's, or the model's own), its probe."""
    from thinkrl.probe.session import run_probe
    from thinkrl.run.intact import find_checkpoint
    from thinkrl.settings import load_config, resolve

    seed, config, ckpt = ps.seed + k, regime.get("config"), None
    if pf is not None:
        run_dir = output / f"start-{k}"
        train_start(pf, run_dir, seed)
        from_run = find_checkpoint(str(run_dir))
    if from_run is not None:
        run_dir, ckpt = from_run
        config = run_dir / "config.yaml"
    if ps.starts > 1:
        console.print(f"probe: start {k + 1} of {ps.starts} (seed {seed})")
    shorthands = {"model.name": regime.get("model.name"), "data.name": regime.get("data.name")}
    cfg = resolve(load_config(config, regime["overrides"], recipe=False, **shorthands))
    results, begin = run_probe(cfg, replace(ps, seed=seed), ckpt, renyi)
    setting = {"model": cfg.model.name, "data": cfg.data.name, "group_size": cfg.rollout.group_size, "lr": cfg.train.lr,
               "max_new_tokens": cfg.rollout.max_new_tokens, "start": list(pf.start) if pf else None}  # fmt: skip
    begin = {"seed": seed, "from": str(ckpt) if ckpt else None, **{k: _round(v) for k, v in begin.items()}}
    return {"start": k, "setting": setting, "begin": begin, "raw": results}


def _round(v: Any) -> Any:
    return float(f"{v:.4g}") if isinstance(v, float) else v


def _report(output: Path, ps: ProbeSettings, pf: ProbeFile | None, records: list[dict]) -> None:
    labels = [as_arm(a).label for a in ps.methods]
    primary = pf.primary if pf else ()
    starts = [r["raw"] for r in records]
    declared = {a.label: {"method": a.method, **{k: v for k, v in a.params}, **({} if a.recipe else {"recipe": False})}
                for a in map(as_arm, ps.methods)}  # fmt: skip
    setting = {**records[0]["setting"], "arms": declared, "replicates_per_start": ps.replicates, "groups": ps.groups,
               "stale_prompts": ps.stale_prompts, "stale_updates": ps.stale_updates, "reference_prompts": ps.reference_prompts,
               "first_seed": ps.seed, "starts": ps.starts, "old_policy": ps.old_policy}  # fmt: skip
    summary = summarise(starts, labels, primary)
    write(output, summary, setting, [r["begin"] for r in records], starts)
    for c in summary["comparisons"]:
        if c["role"] == "primary" or not primary:
            console.print(f"- {c['verdict']}", markup=False)
    seconds = sum(r["begin"].get("seconds", 0) for r in records)
    console.print(f"probe: {output / 'probe.md'} (and probe.json); {seconds:.0f} s over {ps.starts} start(s)", markup=False)
