"""Loading a run configuration: defaults (thinkrl/config/sections.py) -> YAML file -> strict `-o key=value` overrides,
then the cross-field checks of `resolve`.

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
    return cfg


def resolve(cfg: Config) -> Config:
    """Validate cross-field rules and fill derived values (the method's full params, output_dir)."""
    from thinkrl.methods import get_method  # late: methods import config helpers

    method = get_method(cfg.method.name, **cfg.method.params)
    cfg.method.params = method.config_dict()
    if cfg.seeds.enabled is None:
        cfg.seeds.enabled = "prefix_mask" in method.requires
    if cfg.method.params.get("norm_length") == 0:  # seq-mean-token-sum-norm's constant L: the budget
        cfg.method.params["norm_length"] = cfg.rollout.max_new_tokens
    r, t = cfg.rollout, cfg.train
    checks = [
        (r.group_size >= 1, "rollout.group_size must be >= 1"),
        (r.prompts_per_step >= 1, "rollout.prompts_per_step must be >= 1"),
        (r.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1"),
        (r.temperature > 0, "rollout.temperature must be > 0 for training (sampling)"),
        (0 < r.top_p <= 1, "rollout.top_p must be in (0, 1]"),
        (t.steps >= 1, "train.steps must be >= 1"),
        (t.lr > 0, "train.lr must be > 0"),
        (t.micro_batch_size >= 1, "train.micro_batch_size must be >= 1"),
        (t.micro_batch_tokens >= 0, "train.micro_batch_tokens must be >= 0 (0 = no cap)"),
        (t.mini_batches >= 1 and t.epochs >= 1, "train.mini_batches and train.epochs must be >= 1"),
        (r.prompts_per_step * r.group_size >= t.mini_batches, "train.mini_batches exceeds the completions per step"),
        (len(t.adam_betas) == 2, "train.adam_betas needs two values"),
        (t.max_nonfinite_steps >= 0, "train.max_nonfinite_steps must be >= 0 (0 = never stop)"),
        (cfg.model.lora.rank >= 0, "model.lora.rank must be >= 0 (0 = full fine-tuning)"),
        (cfg.verifier.timeout > 0 and cfg.verifier.workers >= 1, "verifier.timeout > 0 and verifier.workers >= 1"),
        (cfg.eval.every >= 0 and cfg.eval.limit >= 0, "eval.every and eval.limit must be >= 0"),
        (r.max_sampling_rounds >= 1, "rollout.max_sampling_rounds must be >= 1"),
        (r.staleness >= 0, "rollout.staleness must be >= 0 (0 = sample with the current policy)"),
        (cfg.seeds.every >= 1 and cfg.seeds.pool_size >= 1, "seeds.every and seeds.pool_size must be >= 1"),
        (not cfg.seeds.enabled or 1 <= cfg.seeds.per_group < r.group_size,
         f"seeds.per_group={cfg.seeds.per_group} must be in [1, rollout.group_size) so each group keeps on-policy samples"),
        (not (cfg.seeds.enabled and t.old_policy == "sampler"), "seeds.enabled needs train.old_policy=recompute (seeded prefixes come from another policy)"),
        (not cfg.seeds.enabled or 0 < cfg.seeds.frac_min <= cfg.seeds.frac_max <= 1, "seeds needs 0 < frac_min <= frac_max <= 1"),
        (not cfg.seeds.enabled or cfg.seeds.prefix != "tokens" or 1 <= cfg.seeds.tokens_min <= cfg.seeds.tokens_max < r.max_new_tokens,
         "seeds needs 1 <= tokens_min <= tokens_max < rollout.max_new_tokens"),
        (0 <= cfg.reward.overlong_buffer < r.max_new_tokens, "reward.overlong_buffer must be in [0, rollout.max_new_tokens)"),
        (cfg.correction.c_max > 0 and 0 <= cfg.correction.c_min < cfg.correction.c_max, "correction needs 0 <= c_min < c_max"),
        (cfg.eval.preset in ("auto", "train", "greedy", "reasoning"), f"eval.preset={cfg.eval.preset!r}: choose auto, train, greedy or reasoning"),
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
