"""What a resume may change, the record of what it changed, and which directories a new run may use.

A resume compares its settings with RUN_DIR/config.yaml: what makes the run (GUARDED: the model, data and
prompts, the reward, the loss and its method, the advantages, the distribution sampled from, every seed) may
change only with --allow-changes, since the run's metrics would otherwise silently measure another objective;
every change is printed once and appended to RUN_DIR/changes.jsonl, written only once the resumed run has set
up. A new run refuses a directory holding a run or the user's files. The resume command thinkrl prints is
shell-quoted (resume_command). The rules, and the changes.jsonl format: docs/runs.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import yaml

from thinkrl.config import Config
from thinkrl.config.load import flatten, to_dict
from thinkrl.errors import UserError
from thinkrl.run.atomic import write_atomic
from thinkrl.run.console import console, shown
from thinkrl.run.jsonl import read_jsonl

CHANGES = "changes.jsonl"


def _keys(section: str, names: str) -> set[str]:
    return {f"{section}.{name}" for name in names.split()}


# Every config key is in exactly one of GUARDED, HARMLESS and IGNORED (tests/test_resume_guard.py fails on a new
# key until it is placed); a method's own parameters (method.<name>: clipping, KL coefficients, ...) and any key
# not placed are guarded. GUARDED: what the run optimises and the distribution it samples from.
GUARDED = frozenset(
    {"method.name", "model.name", *_keys("model.lora", "rank alpha dropout target_modules")}
    | _keys("prompt", "template system instruction")
    | _keys("data", "name split subset problem_key answer_key max_prompt_tokens limit")
    | _keys("data.arith", "min_value max_value ops terms train_size test_size seed")
    | _keys("rollout", "group_size prompts_per_step max_new_tokens min_new_tokens temperature top_p top_k")
    | _keys("rollout", "precision staleness dynamic_sampling max_sampling_rounds mask_truncated")  # off-policy, filters
    | _keys("advantage", "estimator eps")
    | _keys("reward", "functions overlong_buffer overlong_penalty")
    | _keys("correction", "mode level c_max c_min band eps")
    | {"verifier.grader"}
    | _keys("train", "seed entropy_coef mini_batches epochs old_policy")  # the loss and how off-policy its updates are
    | _keys("seeds", "enabled every pool_size keep_initial per_group prefix frac_min frac_max tokens_min tokens_max snap")
)
# HARMLESS: how long and how fast the run optimises (steps, the optimizer: the fix for a diverging run is a lower
# train.lr), memory and speed (batching, the engine, workers, the trainer's dtypes: the fix for a bf16 overflow is
# float32; a checkpoint's masters load into either master dtype), the grading time limit and when a failing
# reward function stops the run, checkpoints, logging, evaluation.
HARMLESS = frozenset(
    {"model.dtype", "model.master_dtype", "verifier.timeout", "verifier.workers", "reward.max_failure_share", "seeds.storage"}
    | _keys("rollout", "batch_size engine vllm.memory vllm.max_model_len vllm.sleep agreement_every server_url server_timeout adapter_dir")
    | _keys("train", "steps lr schedule warmup_steps weight_decay adam_betas grad_clip")
    | _keys("train", "micro_batch_tokens gradient_checkpointing micro_batch_size save_every keep_last max_nonfinite_steps")
    | _keys("log", "rollouts_every trackers project")
    | _keys("eval", "every datasets n limit preset max_new_tokens")
)
# not compared: the path a run is resumed by may be spelled differently; the recipe flag only says where the
# values came from (the values themselves are compared)
IGNORED = frozenset({"output_dir", "method.recipe"})
# what a start that failed before training can leave in an --output-dir (thinkrl's own files)
_LEFTOVERS = re.compile(r"\.lock|data_report\.json|\..+\.tmp(-\d+)?")
# what `thinkrl eval` writes into each of its output directories
_EVAL_FILES = re.compile(r"\.lock|settings\.json|samples\.jsonl|summary\.json|\..+\.tmp(-\d+)?")


def makes_the_run(key: str) -> bool:
    """A setting a resume may change only with --allow-changes: a guarded one, a method parameter, or one not
    yet placed (safe until decided)."""
    return key not in IGNORED and key not in HARMLESS


def resume_command(run_dir: Path, *args: str) -> str:
    """`thinkrl train --resume RUN_DIR ARGS` as a shell reads it back: a path with a space or a quote pastes whole."""
    return shlex.join(["thinkrl", "train", "--resume", str(run_dir), *args])


def _settings(data: dict) -> dict[str, Any]:
    return {k: v for k, v in flatten(data) if k not in IGNORED}


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
    with the settings that run had at that step (config.yaml with the changes recorded after it undone); print
    each change accepted, those allowed by allow_changes marked so."""
    saved = _saved(run_dir)
    if saved is None:
        return
    base = _before(saved, [e for e in _entries(run_dir) if e["step"] > step])
    changed = _differ(base, cfg)
    refused = {k: v for k, v in changed.items() if makes_the_run(k)}
    if refused and not allow_changes:
        if "method.name" in refused:  # another method has other parameters: its name says it
            refused = {k: v for k, v in refused.items() if k == "method.name" or not k.startswith("method.")}
        listing = ", ".join(f"{k} {_show(old)} -> {_show(new)}" for k, (old, new) in refused.items())
        raise UserError(
            f"--resume {run_dir} changes what makes the run: {listing}; its checkpoints and metrics.jsonl were made with "
            f"the values in {run_dir / 'config.yaml'}. Drop the change to continue the run as it was, start a new run with another "
            f"--output-dir, or add --allow-changes to continue with the new values (recorded in {run_dir / CHANGES})"
        )
    for key, (old, new) in changed.items():  # accepted: each said once, as changes.jsonl will record it
        allowed = " (allowed)" if key in refused else ""
        console.print(shown(f"resume: changed {key} {_show(old)} -> {_show(new)}{allowed}"), soft_wrap=True)


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


def forget_failed_start(run_dir: Path, new_run: bool):
    """An exit callback (ExitStack.push) for a run that has just written config.yaml and data_report.json. For a new
    run (`new_run`; rank 0) that then fails before its first step is logged (a reward function that returns NaN, a
    broken grader, Ctrl-C twice), it removes those two files, so the directory holds no run and the same command
    works again. Nothing else is touched, and nothing once metrics.jsonl or checkpoints/ exists, or when the error's
    own fix is a --resume of this directory (out of memory, a full disk mid-step: that needs config.yaml); a kill,
    which runs no callback, leaves config.yaml, and that directory resumes from step 0."""

    def undo(exc_type, exc, tb) -> bool:
        logged = (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()
        if new_run and exc_type is not None and not logged and "--resume" not in str(exc):
            for name in ("config.yaml", "data_report.json"):
                try:
                    (run_dir / name).unlink(missing_ok=True)
                except OSError:  # never hide the run's own error behind this one
                    pass
        return False  # the error goes on

    return undo


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
        raise UserError(f"{run_dir} already holds a run; continue it with --resume {shlex.quote(str(run_dir))} or pick a new --output-dir")
    others = sorted(p.name for p in run_dir.iterdir() if not (_LEFTOVERS.fullmatch(p.name) or _only_evaluations(p)))
    if others:
        held = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(
            f"--output-dir {run_dir} is not empty ({held}) and is not a thinkrl run directory; a run writes config.yaml, "
            "metrics.jsonl and checkpoints/ there, so choose a new or empty --output-dir"
        )


def resumed_config(resume: Path, config: Path | None, method: str | None, allow_changes: bool) -> Path:
    """The config.yaml `thinkrl train --resume RUN_DIR` runs with, after the checks its arguments get before
    anything loads: no second config, a run directory, the run's own method unless --allow-changes."""
    if config is not None:
        raise UserError("--resume uses RUN_DIR/config.yaml; drop the CONFIG argument (overrides with -o still apply)")
    saved = resume / "config.yaml"
    if not saved.is_file():
        raise UserError(f"--resume {resume}: no config.yaml there, so it is not a thinkrl run directory")
    trained = ((yaml.safe_load(saved.read_text()) or {}).get("method") or {}).get("name")
    if method is not None and method != trained and not allow_changes:
        raise UserError(f"--resume {resume} continues a {trained} run; drop --method {method} (or start a new run with it)")
    return saved
