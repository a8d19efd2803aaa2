"""A probe file: the arms (a method with its own parameters), the starting run, the shared regime and the
primary measures, written down before anything runs, so that one comparison is one file and one command.

    name: stare-vs-dapo
    start: [train.steps=5]               # the starting policy: grpo trained with these overrides, into OUT/start
    overrides: [rollout.group_size=4]    # the probe's shared regime
    probe: {starts: 5, replicates: 40, stale_updates: 2}   # starts, replicates (per start), groups, stale_prompts,
                                                 # stale_updates, reference_prompts, seed, old_policy (sampler or recompute)
    arms:                                # the first arm is the baseline
      dapo: {method: dapo}
      stare: {method: stare, params: {target_entropy: 5.0}}
      wide: {method: ctpo, params: {eps_lo: {drift: 1.0}}}   # {drift: f}: f x the start's per-token log-ratio sd
      bare: {method: drpo, recipe: false}   # without the method.* values of its recipe (taken by default)
    primary: [entropy_slope]             # Holm adjusts over these; the other measures are reported as secondary
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from thinkrl.errors import UserError
from thinkrl.probe.measure import OLD_POLICIES, ProbeArm, ProbeSettings, check_old_policy
from thinkrl.probe.report import MEASURES
from thinkrl.study.spec import _overrides, named_arms, read_yaml

KNOWN = ("name", "start", "overrides", "probe", "arms", "primary")
SETTINGS = tuple(f.name for f in fields(ProbeSettings) if f.name != "methods")


@dataclass(frozen=True)
class ProbeFile:
    name: str
    arms: tuple[ProbeArm, ...]
    start: tuple[str, ...]
    overrides: tuple[str, ...]
    settings: dict[str, Any]
    primary: tuple[str, ...]
    digest: str = ""  # sha256 of the file's bytes: a start measured under another version of it is refused

    def probe_settings(self, **flags: Any) -> ProbeSettings:
        """The file's settings, with any flag given on the command line (not None) taking precedence."""
        given = {k: v for k, v in flags.items() if v is not None}
        return ProbeSettings(self.arms, **{**self.settings, **given})


def load_probe_file(path: Path) -> ProbeFile:
    raw = read_yaml(path, "probe file", "a YAML file with arms, start and primary: see bench/repro/probes/")
    where = str(path)
    if not isinstance(raw, dict):
        raise UserError(f"{where}: a probe file is a mapping with {', '.join(KNOWN)}")
    unknown = sorted(set(raw) - set(KNOWN))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; a probe file has {', '.join(KNOWN)}")
    primary = raw.get("primary") or []
    bad = [m for m in primary if m not in MEASURES] if isinstance(primary, list) else [primary]
    if not primary or bad:
        raise UserError(f"{where}: primary must list one or more of {', '.join(MEASURES)} (got {bad[0] if bad else 'none'})")
    return ProbeFile(
        name=str(raw.get("name") or path.stem),
        arms=_arms(raw.get("arms"), where),
        start=_overrides(raw.get("start", []), f"{where}: start"),
        overrides=_overrides(raw.get("overrides", []), f"{where}: overrides"),
        settings=_settings(raw.get("probe") or {}, where),
        primary=tuple(primary),
        digest=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def _settings(value: Any, where: str) -> dict[str, Any]:
    numbers = {k: v for k, v in value.items() if k != "old_policy"} if isinstance(value, dict) else None
    if numbers is None or set(value) - set(SETTINGS) or not all(isinstance(v, int) for v in numbers.values()):
        raise UserError(
            f"{where}: probe is a mapping of whole numbers over {', '.join(s for s in SETTINGS if s != 'old_policy')} (and "
            f"old_policy: {' or '.join(OLD_POLICIES)}), e.g. probe: {{replicates: 200}}"
        )
    check_old_policy(value.get("old_policy", "sampler"), f"{where}: probe: old_policy")  # before the start run trains
    return dict(value)


def _arms(value: Any, where: str) -> tuple[ProbeArm, ...]:
    arms = []
    recipes = {n: s.get("recipe", True) for n, s in value.items() if isinstance(s, dict)} if isinstance(value, dict) else {}
    bare = {n: {k: v for k, v in s.items() if k != "recipe"} if isinstance(s, dict) else s for n, s in value.items()} if recipes else value
    for name, spec in named_arms(bare, where, "params", "{method: NAME, params: {KEY: VALUE, ...}, recipe: true|false}"):
        params = spec.get("params") or {}
        if not isinstance(params, dict):
            raise UserError(f"{where}: arm {name}: params is a mapping of the method's Config fields, e.g. {{clip_high: 0.28}}")
        for key, v in params.items():
            if isinstance(v, dict) and (set(v) != {"drift"} or isinstance(v["drift"], bool) or not isinstance(v["drift"], (int, float))):
                raise UserError(f"{where}: arm {name}: {key}: a scaled value is {{drift: NUMBER}} (NUMBER x the start's log-ratio sd)")
        if not isinstance(recipes.get(name, True), bool):
            raise UserError(f"{where}: arm {name}: recipe is true (the method's recipe's method.* values, the default) or false")
        arms.append(ProbeArm(name, spec["method"], tuple(sorted(params.items())), recipes.get(name, True)))
    return tuple(arms)


def train_start(pf: ProbeFile, start_dir: Path, seed: int = 0) -> None:
    """A starting policy: grpo with the file's start overrides and train.seed = seed, trained into start_dir
    unless it is there (an interrupted one continues from its last checkpoint)."""
    from thinkrl.study.grid import run_state

    state = run_state(start_dir)
    if state == "done":
        return
    base = [sys.executable, "-m", "thinkrl", "train"]
    if state == "partial":
        cmd = [*base, "--resume", str(start_dir)]
    else:
        overrides = [x for o in [*pf.start, f"train.seed={seed}"] for x in ("-o", o)]
        cmd = [*base, "--method", "grpo", "--recipe", "none", *overrides, "--output-dir", str(start_dir)]
    print(f"probe: the starting policy: {' '.join(['thinkrl', *cmd[3:]])}", flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise UserError(f"training the starting policy failed (above); fix it and run the probe again: {start_dir} resumes")
