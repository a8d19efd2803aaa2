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
from thinkrl.config.describe import recipe_line
from thinkrl.errors import UserError
from thinkrl.methods import Method, get_method, method_class
from thinkrl.run.atomic import write_atomic


def recipe_of(name: str) -> dict[str, Any]:
    """The recipe of registered method `name` (an unknown name fails in one line naming the choices)."""
    return method_class(name).recipe


def load_config(path: str | Path | None = None, overrides: list[str] = (), recipe: bool | str | None = None, **shorthands: Any) -> Config:
    """config.load.load_config with a recipe (the method's own, or the method `recipe` names) beneath the file and
    the overrides."""
    return config_load.load_config(path, overrides, recipe, recipes=recipe_of, **shorthands)


def applied_recipe(cfg: Config) -> dict[str, Any]:
    """The recipe keys and values loading `cfg` applied beneath its file and -o (empty when none applied)."""
    source = config_load.recipe_source(cfg.method.name, cfg.method.recipe)
    return config_load.applied_recipe(recipe_of(source), own=source == cfg.method.name) if source else {}


def recipe_report(cfg: Config) -> str:
    """The line a run prints about its recipe (thinkrl.config.describe.recipe_line), from `cfg` as loaded."""
    source = config_load.recipe_source(cfg.method.name, cfg.method.recipe)
    applied = applied_recipe(cfg)
    left_out = tuple(k for k in (recipe_of(source) if source else {}) if k not in applied)
    return recipe_line(cfg, applied, left_out)


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


def recipe_flag(recipe: str | None, no_recipe: bool) -> str | bool | None:
    """--recipe NAME / --no-recipe as load_config's `recipe` (None: the method's own); an unknown name fails here,
    naming the methods."""
    if recipe is not None and no_recipe:
        raise UserError(f"--recipe {recipe} and --no-recipe disagree; keep one (--no-recipe is --recipe none)")
    if recipe is not None and recipe.strip().lower() not in ("none", "false", "true", "own"):
        method_class(recipe)
    return False if no_recipe else recipe
