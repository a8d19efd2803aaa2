"""Loading a run configuration, in one order: defaults (config/sections.py) <- the method's recipe <- a YAML file
<- `-o key=value` overrides <- CLI shorthands (--method, --model, --dataset, --output-dir); then each
section's own checks (`validate`) and the checks that span sections (`resolve`).

A method's recipe is the regime its paper studies (`thinkrl methods NAME` prints it): `--method ctpo` trains
CTPO with 4 mini-batches and sequence-level TIS, not GRPO's on-policy single update. `method.recipe: NAME`
(`--recipe NAME`) applies another method's regime instead, so two losses can be compared in one regime;
`method.recipe: none` (`--recipe none`, `--no-recipe`) applies none. Values are parsed as YAML; every unknown
key and ill-typed value is reported in one message, each with where it came from (file:line or the -o text)
and the closest valid key, or the thinkrl name of a TRL / verl setting. The resolved config (every default filled in) is written into each
run directory; values that follow rollout.max_new_tokens (norm_length 0, a fractional reward.overlong_buffer)
stay as written there and are worked out where they are used, so a resume with another budget follows it.

config/ never imports a method: what it needs of one (its recipe, its resolved fields, what it corrects
itself) is the MethodSpec below, and thinkrl/settings.py passes the registry's methods in.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from thinkrl.config import Config, MethodSection
from thinkrl.config.files import read_yaml
from thinkrl.config.hints import unknown_key_hint
from thinkrl.config.learner import CorrectionConfig
from thinkrl.config.rollout import server_refusal
from thinkrl.config.typecheck import check_finite, coerce, hints
from thinkrl.errors import UserError, short


class MethodSpec(Protocol):
    """What config needs of a method (thinkrl.methods.Method has it all)."""

    name: str
    recipe: Mapping[str, Any]  # dotted config keys the method's paper regime sets
    requires: frozenset[str]  # the batch fields its loss reads
    mismatch_corrected: str  # "all": it weights every token by pi_old / mu itself
    acts_off_policy: bool  # it acts only through its importance ratios
    advantage: str  # its advantage estimator
    cfg: Any  # its own Config instance
    Config: type  # its Config dataclass

    def config_dict(self) -> dict[str, Any]: ...


RecipeLookup = Callable[[str], Mapping[str, Any]]  # method name -> its recipe


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree, e.g. 'train.lr'."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = hints(cls)[f.name]
        if dataclasses.is_dataclass(tp) and tp is not MethodSection:
            keys += all_keys(tp, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _set(cfg: Config, dotted: str, value: Any) -> None:
    """Set one dotted key with type checking; `method.<x>` goes into the method's params."""
    parts = dotted.split(".")
    if parts[0] == "method" and len(parts) == 2:
        if parts[1] == "name":
            cfg.method.name = coerce(value, str, dotted)
        elif parts[1] == "recipe":
            cfg.method.recipe = recipe_setting(value, dotted)
        elif parts[1] == "params":
            cfg.method.params.update(coerce(value, dict, dotted))
        else:  # validated later against the method's own Config
            cfg.method.params[parts[1]] = value
        return
    obj: Any = cfg
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
        if part not in names:
            raise UserError(f"unknown config key '{dotted}'{unknown_key_hint(dotted, all_keys())}")
        tp = hints(type(obj))[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                if not isinstance(value, dict):
                    raise UserError(f"{dotted}: expected a mapping of its keys, got {short(value)}")
                for k, v in value.items():
                    _set(cfg, f"{dotted}.{k}", v)
            else:
                setattr(obj, part, coerce(value, tp, dotted))
        else:
            obj = getattr(obj, part)


def flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """{'train': {'lr': 1}} -> [('train.lr', 1)]; the method section stays one level deep."""
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "method.params" and not (prefix == "method." and k != "params"):  # noqa: SIM102
            out += flatten(v, key + ".")
        else:
            out.append((key, v))
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """'train.lr=1e-4' -> ('train.lr', 1e-4)."""
    if "=" not in text:
        raise UserError(f"-o {text}: an override is one argument KEY=VALUE with no spaces, e.g. -o {text}=VALUE (-o train.lr=1e-4)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError):  # ValueError: an integer past Python's 4,300-digit limit
        value = raw
    except RecursionError:  # thousands of nested [ or {: no setting is that deep
        raise UserError(f"-o {key.strip()[:120]}=...: the value nests too deeply to read; write a plain value") from None
    return key.strip(), value


def recipe_setting(value: Any, where: str) -> bool | str:
    """method.recipe as written (true, false, none, a method name) -> True, False or the method name."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        word = value.strip()
        return False if word.lower() in ("none", "false", "off") else True if word.lower() in ("true", "own") else word
    raise UserError(f"{where}={value!r}: write true (the method's own recipe), none, or a method name such as ctpo")


def recipe_source(method: str, setting: bool | str) -> str | None:
    """The method whose recipe applies: the run's own (True), another one (its name), or none (False)."""
    return method if setting is True else setting or None


def applied_recipe(recipe: Mapping[str, Any], own: bool) -> dict[str, Any]:
    """What of a recipe applies: all of the method's own; of another method's only the regime, not the
    `method.*` keys, which are that loss's own parameters."""
    return {k: v for k, v in recipe.items() if own or not k.startswith("method.")}


def load_config(
    path: str | Path | None = None,
    overrides: list[str] = (),
    recipe: bool | str | None = None,
    recipes: RecipeLookup | None = None,
    **shorthands: Any,
) -> Config:
    """Defaults <- a recipe (from `recipes`: the method's own, or the method `recipe` / method.recipe names; none
    when it is False or none) <- YAML file <- `key=value` overrides <- CLI shorthands (--method, --model, ...).
    Every bad key is reported in one error. Without `recipes` no recipe applies (a saved config.yaml holds every
    key already)."""
    entries: list[tuple[str, Any, str]] = []  # (dotted key, value, where it was written)
    if path is not None:
        path = Path(path)
        entries += [(key, value, f"{path}:{line}") for key, value, line in read_yaml(path)]
    entries += [(*parse_override(text), f"-o {text if len(text) <= 200 else text[:197] + '...'}") for text in overrides]
    entries += [(key, value, f"--{key.rsplit('.', 1)[-1].replace('_', '-')}") for key, value in shorthands.items() if value is not None]
    name = next((v for k, v, _ in reversed(entries) if k == "method.name"), MethodSection.name)
    if recipe is not None:
        entries.append(("method.recipe", recipe, "--recipe"))
    cfg = Config()
    setting = next((v for k, v, _ in reversed(entries) if k == "method.recipe"), True)
    source = recipe_source(name, recipe_setting(setting, "method.recipe")) if isinstance(name, str) else None
    if source is not None and recipes is not None:
        for key, value in applied_recipe(recipes(source), own=source == name).items():
            _set(cfg, key, value)
    errors = []
    for key, value, where in entries:
        try:
            _set(cfg, key, value)
        except UserError as e:
            errors.append(f"{e} ({where})" if not str(e).startswith(where) else str(e))
    if len(errors) == 1:
        raise UserError(errors[0])
    if errors:
        raise UserError(f"{len(errors)} config errors: " + "; ".join(errors))
    validate(cfg)
    return cfg


def validate(cfg: Any, prefix: str = "") -> None:
    """Run every section's own checks (its __post_init__) on the values it holds now, so a value set after
    construction (YAML, -o) is checked like a default; the message is prefixed with the section's path."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate(value, f"{prefix}{f.name}.")
    post_init = getattr(cfg, "__post_init__", None)
    if post_init is not None:
        try:
            post_init()
        except ValueError as e:
            raise UserError(f"{prefix}{e}") from None
    check_finite(cfg, prefix)  # after the section's own checks: their messages name the range


def resolve(cfg: Config, method: MethodSpec) -> Config:
    """The rules that span sections of a validated `cfg`; fill derived values (`method`'s full params: it is
    cfg.method built, seeds.enabled, the constant L of seq-mean-token-sum-norm, output_dir)."""
    cfg.method.params = method.config_dict()
    if (refusal := conflict(method, cfg.correction)) is not None:  # a method that corrects from mu itself
        raise UserError(refusal)
    if cfg.seeds.enabled is None:
        cfg.seeds.enabled = "prefix_mask" in method.requires
    # Values that follow the budget are resolved where they are used, never written back: config.yaml keeps
    # norm_length 0 and a fractional reward.overlong_buffer as the user wrote them, so a resume with another
    # rollout.max_new_tokens follows the new budget (reward.overlong_tokens does the buffer, in the rollout).
    if getattr(method.cfg, "norm_length", None) == 0:  # seq-mean-token-sum-norm's constant L: the budget
        method.cfg.norm_length = cfg.rollout.max_new_tokens
    r, t, s = cfg.rollout, cfg.train, cfg.seeds
    buffer, written = cfg.reward.overlong_tokens(r.max_new_tokens), cfg.reward.overlong_buffer
    written = int(written) if float(written).is_integer() else written  # 48, not 48.0, as the user wrote it
    estimator = method.advantage if cfg.advantage.estimator == "auto" else cfg.advantage.estimator
    checks = [
        (  # every estimator (grpo, no_std, rloo) is group-relative: a group of one would train on the raw reward
            r.group_size >= 2,
            f"rollout.group_size=1: advantage.estimator={estimator} compares each completion with the others of its prompt's "
            "group, and a group of one has none to compare with; set rollout.group_size to 2 or more",
        ),
        (
            r.prompts_per_step * r.group_size >= t.mini_batches,
            f"train.mini_batches={t.mini_batches} exceeds the {r.prompts_per_step * r.group_size} completions per step",
        ),
        (
            not s.enabled or s.per_group < r.group_size,
            f"seeds.per_group={s.per_group} must be below rollout.group_size={r.group_size} so each group keeps on-policy samples",
        ),
        (
            not (s.enabled and t.old_policy == "sampler"),
            "seeds.enabled needs train.old_policy=recompute (seeded prefixes come from another policy)",
        ),
        (
            not s.enabled or s.prefix != "tokens" or s.tokens_max < r.max_new_tokens,
            f"seeds.tokens_max={s.tokens_max} must be below rollout.max_new_tokens={r.max_new_tokens}",
        ),
        (
            buffer < r.max_new_tokens,
            f"reward.overlong_buffer={written} must be below rollout.max_new_tokens={r.max_new_tokens}",
        ),
    ]
    checks.append((not (refused := server_refusal(cfg)), refused or ""))  # rollout.engine=vllm_server takes LoRA only
    for ok, msg in checks:
        if not ok:
            raise UserError(msg)
    if cfg.output_dir is None:  # time-sorted; the random part keeps runs started in the same second apart
        cfg.output_dir = f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}-{cfg.method.name}"
    return cfg


def conflict(method: MethodSpec, cfg: CorrectionConfig) -> str | None:
    """One line refusing correction.mode tis / mis for a method that corrects every token from mu itself."""
    if cfg.mode == "none" or method.mismatch_corrected != "all":
        return None
    fix = "set correction.mode=none"
    if getattr(method.cfg, "anchor", None) == "behav":
        why = "its ratio is already taken against the sampler mu (anchor=behav)"
        fix += ", or method.anchor=old to ratio against pi_old and let the correction bridge mu -> pi_old"
    else:
        why = "it already weights every token by pi_old / mu"
    return f"correction.mode={cfg.mode} with method {method.name}: {why}, so the weight pi_old / mu would correct each token twice; {fix}"


def on_policy_note(cfg: Config, cls: MethodSpec | type) -> str | None:
    """One line when the resolved settings make the method's gradient grpo's: a method (`cls`, its class)
    that acts only through its ratios, in a run where every ratio is 1 (one update per rollout, no precision
    or staleness gap)."""
    r, t = cfg.rollout, cfg.train
    if not cls.acts_off_policy or t.mini_batches * t.epochs > 1 or r.precision != "same" or r.staleness:
        return None
    aggregation = cfg.method.params.get("aggregation", "seq-mean-token-mean")
    estimator = cls.advantage if cfg.advantage.estimator == "auto" else cfg.advantage.estimator
    ratio_keys = ("train.mini_batches", "train.epochs", "rollout.staleness", "rollout.precision")
    moves = [f"{k}={v}" for k, v in cls.recipe.items() if k in ratio_keys]
    name = cfg.method.name
    own = f"its own recipe sets {', '.join(moves)}, left out or overridden here" if moves else f"{name}'s own recipe sets none of them"
    return (
        f"note: {name} acts only through its importance ratios, and this run is on-policy (one update per "
        f"rollout, rollout.precision=same, rollout.staleness=0): every ratio is 1, so its gradient is grpo's with "
        f"method.aggregation={aggregation} and advantage.estimator={estimator}. To see it act set train.mini_batches > 1, "
        f"rollout.staleness > 0 or rollout.precision ({own})."
    )


def to_dict(cfg: Config) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["method"] = {"name": cfg.method.name, "recipe": cfg.method.recipe, **cfg.method.params}
    return d


def config_yaml(cfg: Config) -> str:
    """The text of a run's config.yaml."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
