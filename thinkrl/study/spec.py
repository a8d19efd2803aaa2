"""A study file: arms (a method plus overrides) x paired seeds in one shared regime, with the metrics and
comparisons declared before anything runs.

    name: grpo-vs-dr_grpo
    recipe: none                    # one regime for every arm: a method's recipe, or none
    overrides: [train.steps=4]      # the shared regime, every arm
    seeds: 4                        # or a list: [0, 1, 2, 3]
    arms:
      grpo: {method: grpo}
      dr_grpo: {method: dr_grpo, overrides: [method.clip_low=0.2]}
    baseline: grpo
    metrics:                        # primary metrics; summary: final | mean | last:N
      - {name: reward/mean, summary: "last:2", higher_is_better: true}   # null: no better direction
    comparisons: [[dr_grpo, grpo]]  # default: every arm against the baseline

Seed k of every arm is train.seed=k, so every arm sees the same prompts in the same order and starts from the
same LoRA weights; an arm may therefore not set what would break that pairing (seeds, data, prompts, prompts
per step).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from thinkrl.config.load import parse_override
from thinkrl.errors import UserError

PAIRING_KEYS = ("train.seed", "data.", "prompt.", "rollout.prompts_per_step")  # an arm setting these breaks the pairing
ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a directory name, matched whole (fullmatch: no trailing newline)


@dataclass(frozen=True)
class Metric:
    name: str  # a metrics.jsonl key, e.g. reward/mean or eval/arith/accuracy
    summary: str = "final"  # final: its last logged value; mean: over all steps; last:N: mean of the last N
    higher_is_better: bool | None = True  # None: a measurement with no better direction (e.g. entropy)

    def of(self, series: list[float]) -> float | None:
        """One run's number for this metric from its logged values, in step order (None: never logged)."""
        if not series:
            return None
        if self.summary == "final":
            return series[-1]
        tail = series if self.summary == "mean" else series[-int(self.summary.split(":")[1]) :]
        return sum(tail) / len(tail)


@dataclass(frozen=True)
class Arm:
    name: str
    method: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Study:
    name: str
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    metrics: tuple[Metric, ...]
    comparisons: tuple[tuple[str, str], ...]  # (arm, baseline)
    recipe: str = "none"
    overrides: tuple[str, ...] = ()
    config: str | None = None  # a config file every arm starts from
    plugins: str | None = None  # a directory of method plugins

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def to_yaml(self) -> str:
        d = asdict(self)
        d["arms"] = {a["name"]: {"method": a["method"], "overrides": list(a["overrides"])} for a in d["arms"]}
        d["comparisons"] = [list(c) for c in self.comparisons]
        d["seeds"], d["overrides"] = list(self.seeds), list(self.overrides)
        d["metrics"] = [dict(m) for m in d["metrics"]]
        return yaml.safe_dump(d, sort_keys=False)


def load_study(path: Path) -> Study:
    """The study in `path`, checked: every mistake is one UserError naming the key and the fix."""
    return parse_study(read_yaml(path, "study file", "a YAML file with arms, seeds and metrics: see examples/study/"), str(path))


def read_yaml(path: Path, what: str, hint: str) -> Any:
    """The parsed YAML of a study or probe file, or one UserError saying what is wrong with it. A key written
    twice in one mapping is refused (plain YAML keeps the last one silently: an arm would vanish)."""
    if not path.is_file():
        raise UserError(f"{what} {path} not found ({hint})")
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except (UnicodeDecodeError, RecursionError) as e:
        why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "nested too deeply"
        raise UserError(f"{path}: not a readable YAML file ({why})") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key written twice in one mapping, naming the key and its line."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"key {key!r} appears twice in one mapping (line {key_node.start_mark.line + 1}): "
                            "YAML would keep only the last; rename or remove one",
                            key_node.start_mark,
                        )
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_study(raw: Any, where: str) -> Study:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: a study is a mapping with arms, seeds and metrics (see examples/study/)")
    known = {"name", "arms", "seeds", "metrics", "comparisons", "baseline", "recipe", "overrides", "config", "plugins"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; a study has {', '.join(sorted(known))}")
    arms = _arms(raw.get("arms"), where)
    names = [a.name for a in arms]
    comparisons = _comparisons(raw, names, where)
    recipe = raw.get("recipe", "none")
    return Study(
        name=str(raw.get("name") or Path(where).stem),
        arms=arms,
        seeds=_seeds(raw.get("seeds", 4), where),
        metrics=_metrics(raw.get("metrics"), where),
        comparisons=comparisons,
        recipe="none" if recipe is False else str(recipe),
        overrides=_overrides(raw.get("overrides", []), f"{where}: overrides"),
        config=str(raw["config"]) if raw.get("config") else None,
        plugins=str(raw["plugins"]) if raw.get("plugins") else None,
    )


def _overrides(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
        raise UserError(f"{where}: a list of KEY=VALUE strings, e.g. [train.steps=4]")
    for o in value:
        parse_override(o)  # KEY=VALUE, or the error that says so
    return tuple(value)


def named_arms(value: Any, where: str, second: str, shape: str) -> list[tuple[str, dict]]:
    """(name, spec) of each arm of a study or probe file, checked: two or more, plain names, each a mapping with
    a method and at most `second` besides (`shape` says how to write one)."""
    if not isinstance(value, dict) or len(value) < 2:
        raise UserError(f"{where}: arms needs two or more named arms, e.g. arms: {{grpo: {{method: grpo}}, gspo: {{method: gspo}}}}")
    for name, spec in value.items():
        if not ARM_NAME.fullmatch(str(name)):
            raise UserError(f"{where}: arm name {str(name)!r} must be a plain directory name (letters, digits, _ . -)")
        if not isinstance(spec, dict) or not isinstance(spec.get("method"), str) or set(spec) - {"method", second}:
            raise UserError(f"{where}: arm {name}: write {shape}")
    return [(str(name), spec) for name, spec in value.items()]


def _arms(value: Any, where: str) -> tuple[Arm, ...]:
    arms = []
    for name, spec in named_arms(value, where, "overrides", "{method: NAME, overrides: [KEY=VALUE, ...]}"):
        overrides = _overrides(spec.get("overrides", []), f"{where}: arm {name}: overrides")
        for o in overrides:
            key = parse_override(o)[0]
            if key.startswith(PAIRING_KEYS) or key in ("method.name", "method.recipe"):
                raise UserError(
                    f"{where}: arm {name} sets {key}: arms must share seeds, data, prompts and prompts per step to stay "
                    "paired, and the method and recipe are the arm's `method` and the study's `recipe`"
                )
        arms.append(Arm(name, spec["method"], overrides))
    return tuple(arms)


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and value >= 2:
        return tuple(range(value))
    if isinstance(value, list) and len(value) >= 2 and all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        if len(set(value)) == len(value):
            return tuple(value)
    raise UserError(f"{where}: seeds must be a count >= 2 or a list of distinct integers (a paired test needs two or more)")


def _metrics(value: Any, where: str) -> tuple[Metric, ...]:
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: declare the primary metrics before running, e.g. metrics: [{{name: reward/mean, summary: 'last:5'}}]")
    out = []
    for m in value:
        m = {"name": m} if isinstance(m, str) else m
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or set(m) - {"name", "summary", "higher_is_better"}:
            raise UserError(f"{where}: a metric is {{name: KEY, summary: final | mean | last:N, higher_is_better: true}}")
        summary = str(m.get("summary", "final"))
        if summary not in ("final", "mean") and not re.fullmatch(r"last:[1-9][0-9]*", summary):
            raise UserError(f"{where}: metric {m['name']}: summary {summary!r} must be final, mean or last:N (N >= 1)")
        better = m.get("higher_is_better", True)
        if better is not None and not isinstance(better, bool):
            raise UserError(f"{where}: metric {m['name']}: higher_is_better is true, false or null (no better direction)")
        out.append(Metric(m["name"], summary, better))
    return tuple(out)


def _comparisons(raw: dict, names: list[str], where: str) -> tuple[tuple[str, str], ...]:
    baseline = raw.get("baseline", names[0])
    if baseline not in names:
        raise UserError(f"{where}: baseline {baseline!r} is not an arm; arms: {', '.join(names)}")
    pairs = raw.get("comparisons") or [[n, baseline] for n in names if n != baseline]
    if not isinstance(pairs, list):
        raise UserError(f"{where}: comparisons is a list of [ARM, OTHER_ARM] pairs of arms {', '.join(names)}")
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(p in names for p in pair) and pair[0] != pair[1]):
            raise UserError(f"{where}: comparison {pair!r} must be [ARM, OTHER_ARM] of arms {', '.join(names)}")
        out.append((pair[0], pair[1]))
    return tuple(out)


@dataclass
class Cell:
    """One run of the grid: an arm at a seed."""

    arm: Arm
    seed: int
    run_dir: Path
    log: Path
    state: str = field(default="pending")  # pending | partial | done
