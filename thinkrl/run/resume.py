"""What a resume may change, the record of what it changed, and which directories a new run may use.

A resume compares its settings with RUN_DIR/config.yaml: what makes the run (model, LoRA shape, method and its
parameters, data, prompts, the shape of a step, every seed) may change only with --allow-changes; every change
is appended to RUN_DIR/changes.jsonl, written only once the resumed run has set up. A new run refuses a
directory holding a run or the user's files. The rules, and the changes.jsonl format: docs/runs.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from thinkrl.config import Config
from thinkrl.config.load import flatten, to_dict
from thinkrl.errors import UserError
from thinkrl.run.atomic import write_atomic
from thinkrl.run.jsonl import read_jsonl

CHANGES = "changes.jsonl"
_EXACT = {"model.name", "rollout.group_size", "rollout.prompts_per_step"}
_PREFIXES = ("method.", "model.lora.", "data.", "prompt.")
# not compared: the path a run is resumed by may be spelled differently; the recipe flag only says where the
# values came from (the values themselves are compared)
_IGNORED = {"output_dir", "method.recipe"}
# what a start that failed before training can leave in an --output-dir (thinkrl's own files)
_LEFTOVERS = re.compile(r"\.lock|data_report\.json|\..+\.tmp(-\d+)?")
# what `thinkrl eval` writes into each of its output directories
_EVAL_FILES = re.compile(r"\.lock|settings\.json|samples\.jsonl|summary\.json|\..+\.tmp(-\d+)?")


def makes_the_run(key: str) -> bool:
    """A setting a resume may change only with --allow-changes."""
    return key not in _IGNORED and (key in _EXACT or key.startswith(_PREFIXES) or key.rsplit(".", 1)[-1] == "seed")


def _settings(data: dict) -> dict[str, Any]:
    return {k: v for k, v in flatten(data) if k not in _IGNORED}


def _saved(run_dir: Path) -> dict[str, Any] | None:
    """RUN_DIR/config.yaml as {dotted key: value}; None when there is none."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise UserError(f"{path} could not be read ({type(e).__name__}: {first}); restore it to resume {run_dir}") from None
    if not isinstance(saved, dict):
        raise UserError(f"{path} does not hold a thinkrl config (a mapping of sections); restore it to resume {run_dir}")
    return _settings(saved)


def _entries(run_dir: Path) -> list[dict]:
    """The lines of RUN_DIR/changes.jsonl (malformed ones left out)."""
    path = Path(run_dir) / CHANGES
    try:
        lines = read_jsonl(path) if path.is_file() else []
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} could not be read ({e}); repair or delete it") from None
    return [r for r in lines if isinstance(r, dict) and isinstance(r.get("step"), int) and isinstance(r.get("changed"), dict)]


def _before(saved: dict[str, Any], entries: list[dict]) -> dict[str, Any]:
    """The settings before `entries` were made: their changes undone, newest first."""
    settings = dict(saved)
    for entry in reversed(entries):
        for key, change in entry["changed"].items():
            if isinstance(change, list) and len(change) == 2:
                settings[key] = change[0]
    return settings


def _differ(base: dict[str, Any], cfg: Config) -> dict[str, tuple[Any, Any]]:
    """{key: (base value, value now)}; keys missing from an older config.yaml are not compared."""
    now = _settings(yaml.safe_load(yaml.safe_dump(to_dict(cfg), sort_keys=False)))  # as config.yaml would hold them
    return {k: (base[k], v) for k, v in now.items() if k in base and base[k] != v}


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(run_dir: Path, cfg: Config, allow_changes: bool, step: int) -> None:
    """Refuse (unless allow_changes) a resume from checkpoint `step` that changes what makes the run, compared
    with the settings that run had at that step (config.yaml with the changes recorded after it undone)."""
    saved = _saved(run_dir)
    if saved is None:
        return
    base = _before(saved, [e for e in _entries(run_dir) if e["step"] > step])
    refused = {k: v for k, v in _differ(base, cfg).items() if makes_the_run(k)}
    if refused and not allow_changes:
        if "method.name" in refused:  # another method has other parameters: its name says it
            refused = {k: v for k, v in refused.items() if k == "method.name" or not k.startswith("method.")}
        listing = ", ".join(f"{k} {_show(old)} -> {_show(new)}" for k, (old, new) in refused.items())
        raise UserError(
            f"--resume {run_dir} changes what makes the run: {listing}; its checkpoints and metrics.jsonl were made with "
            f"the values in {run_dir / 'config.yaml'}. Drop the change to continue the run as it was, start a new run with another "
            f"--output-dir, or add --allow-changes to continue with the new values (recorded in {run_dir / CHANGES})"
        )


def record(run_dir: Path, step: int, cfg: Config) -> None:
    """Write RUN_DIR/changes.jsonl (atomically) for a resume from checkpoint `step` with settings `cfg`, before
    config.yaml takes them: lines past `step` are dropped, and this resume's line (if anything changed) is
    relative to the settings the steps up to `step` were made with, so an earlier resume from the same step
    (a failed one included) is folded into it."""
    saved, entries = _saved(run_dir), _entries(run_dir)
    if saved is None:
        return
    keep = [e for e in entries if e["step"] < step]
    changed = _differ(_before(saved, [e for e in entries if e["step"] >= step]), cfg)
    if changed:
        keep.append(
            {
                "step": step,
                "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                "changed": {k: [old, new] for k, (old, new) in changed.items()},
                "allowed": [k for k in changed if makes_the_run(k)],
            }
        )
    if keep != entries:
        write_atomic(Path(run_dir) / CHANGES, "".join(json.dumps(r) + "\n" for r in keep))


def is_run_dir(path: Path) -> bool:
    """Holds metrics.jsonl, checkpoints/ or a config.yaml that thinkrl wrote (every section of the config)."""
    path = Path(path)
    if (path / "metrics.jsonl").exists() or (path / "checkpoints").is_dir():
        return True
    try:
        saved = yaml.safe_load((path / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(saved, dict) and {f.name for f in dataclasses.fields(Config)} <= set(saved)


def _only_evaluations(path: Path) -> bool:
    """`path` is RUN_DIR/eval holding nothing but what `thinkrl eval` writes (its files, in folders)."""
    if path.name != "eval" or path.is_symlink() or not path.is_dir():
        return False
    files = [p for p in path.rglob("*") if not p.is_dir() or p.is_symlink()]
    return all(p.is_file() and not p.is_symlink() and _EVAL_FILES.fullmatch(p.name) for p in files)


def check_new_run_dir(run_dir: Path) -> None:
    """A new run's --output-dir: absent, empty, or holding only what a failed start left."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    if is_run_dir(run_dir):
        raise UserError(f"{run_dir} already holds a run; continue it with --resume {run_dir} or pick a new --output-dir")
    others = sorted(p.name for p in run_dir.iterdir() if not (_LEFTOVERS.fullmatch(p.name) or _only_evaluations(p)))
    if others:
        held = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(
            f"--output-dir {run_dir} is not empty ({held}) and is not a thinkrl run directory; a run writes config.yaml, "
            "metrics.jsonl and checkpoints/ there, so choose a new or empty --output-dir"
        )
