"""A run's settings with its method: the config tree (thinkrl/config) loaded with the method's recipe and
resolved against the method's own fields, through the registry (thinkrl/methods).

config/ defines what it needs of a method (config.load.MethodSpec) and imports none; this is where the two
meet, once, for the CLI, the run's setup and evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thinkrl.config import Config
from thinkrl.config import load as config_load
from thinkrl.methods import Method, get_method, method_class
from thinkrl.run.atomic import write_atomic


def recipe_of(name: str) -> dict[str, Any]:
    """The recipe of registered method `name` (an unknown name fails in one line naming the choices)."""
    return method_class(name).recipe


def load_config(path: str | Path | None = None, overrides: list[str] = (), recipe: bool | None = None, **shorthands: Any) -> Config:
    """config.load.load_config with the method's recipe beneath the file and the overrides."""
    return config_load.load_config(path, overrides, recipe, recipes=recipe_of, **shorthands)


def resolve_with_method(cfg: Config) -> tuple[Config, Method]:
    """The resolved config and the method it names, built once."""
    config_load.validate(cfg)  # every section; the method's own fields are checked by its Config below
    method = get_method(cfg.method.name, **cfg.method.params)
    return config_load.resolve(cfg, method), method


def resolve(cfg: Config) -> Config:
    return resolve_with_method(cfg)[0]


def on_policy_note(cfg: Config) -> str | None:
    return config_load.on_policy_note(cfg, method_class(cfg.method.name))


def save_config(cfg: Config, path: str | Path) -> None:
    """Atomically (thinkrl/run/atomic.py): a full disk or a kill leaves the previous config.yaml whole."""
    write_atomic(path, config_load.config_yaml(cfg))
