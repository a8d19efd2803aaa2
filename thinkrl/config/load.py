"""Loading a run configuration: defaults (thinkrl/config/sections.py) -> YAML file -> strict `-o key=value` overrides,
then each section's own checks (`validate`) and the checks that span sections (`resolve`).

One path only: defaults written in thinkrl/config/sections.py, a YAML in configs/ that holds what differs, then
dotted overrides whose values are parsed with `yaml.safe_load`. Unknown keys and wrong types are errors
that name the key (and the closest valid one). The `method:` section is validated against the chosen
method's own Config. The resolved config (every default filled in) is written into each run directory.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import yaml

from thinkrl.config import Config, MethodSection
from thinkrl.config.typecheck import closest, coerce, hints
from thinkrl.errors import UserError


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
        elif parts[1] == "params":
            cfg.method.params.update(coerce(value, dict, dotted))
        else:  # validated later against the method's own Config
            cfg.method.params[parts[1]] = value
        return
    obj: Any = cfg
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
        if part not in names:
            raise UserError(f"unknown config key '{dotted}'{closest(dotted, all_keys())}")
        tp = hints(type(obj))[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                if not isinstance(value, dict):
                    raise UserError(f"{dotted}: expected a mapping of its keys, got {value!r}")
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
        if isinstance(v, dict) and key != "method.params" and not (prefix == "method." and k != "params"):
            out += flatten(v, key + ".")
        else:
            out.append((key, v))
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """'train.lr=1e-4' -> ('train.lr', 1e-4)."""
    if "=" not in text:
        raise UserError(f"override {text!r} must look like key=value, e.g. -o train.lr=1e-4")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def load_config(path: str | Path | None = None, overrides: list[str] = (), **shorthands: Any) -> Config:
    """Defaults <- YAML file <- `key=value` overrides <- CLI shorthands (--method, --model, ...)."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{path}: malformed YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a mapping of config sections at the top level")
        for key, value in flatten(data):
            _set(cfg, key, value)
    for text in overrides:
        _set(cfg, *parse_override(text))
    for key, value in shorthands.items():
        if value is not None:
            _set(cfg, key, value)
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


def resolve(cfg: Config) -> Config:
    """Check every section, then the rules that span sections; fill derived values (the method's full
    params, seeds.enabled, the constant L of seq-mean-token-sum-norm, output_dir)."""
    from thinkrl.methods import get_method  # late: methods import config helpers

    validate(cfg)
    method = get_method(cfg.method.name, **cfg.method.params)
    cfg.method.params = method.config_dict()
    if cfg.seeds.enabled is None:
        cfg.seeds.enabled = "prefix_mask" in method.requires
    if cfg.method.params.get("norm_length") == 0:  # seq-mean-token-sum-norm's constant L: the budget
        cfg.method.params["norm_length"] = cfg.rollout.max_new_tokens
    r, t, s = cfg.rollout, cfg.train, cfg.seeds
    checks = [
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
            cfg.reward.overlong_buffer < r.max_new_tokens,
            f"reward.overlong_buffer={cfg.reward.overlong_buffer} must be below rollout.max_new_tokens={r.max_new_tokens}",
        ),
    ]
    for ok, msg in checks:
        if not ok:
            raise UserError(msg)
    if cfg.output_dir is None:
        cfg.output_dir = f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method.name}"
    return cfg


def to_dict(cfg: Config) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["method"] = {"name": cfg.method.name, **cfg.method.params}
    return d


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
