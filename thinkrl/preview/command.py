"""`thinkrl config [FILE] [--method M] [--recipe R] [-o KEY=VALUE ...]`: the config `thinkrl train` runs with the
same arguments, resolved as the run resolves it, every key with its doc line and each value the defaults do not
give marked with what set it (defaults < recipe < FILE < -o < --method / --recipe). A config can be read, and a
mistake in it found, without starting a run. Also the checks of the arguments both commands take."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from thinkrl.errors import UserError


def config(
    file: Path | None = typer.Argument(None, help="A train config (YAML), as `thinkrl train FILE` takes it."),
    config_option: Path | None = typer.Option(None, "--config", help="Same as FILE."),
    method: str | None = typer.Option(None, "--method", "-m", help="Show the config --method NAME trains with (its recipe applied)."),
    override: list[str] = typer.Option([], "--override", "-o", help="key=value, as `thinkrl train -o` takes it (repeatable)."),
    recipe: str | None = typer.Option(None, "--recipe", help="Whose regime: a method's name, or none (as `thinkrl train --recipe`)."),
    no_recipe: bool = typer.Option(False, "--no-recipe", help="Same as --recipe none."),
    plugins: Path | None = typer.Option(None, "--plugins", help="Directory of extra method files."),
) -> None:
    """The config `thinkrl train` runs with these arguments: every key with its resolved value and doc line.

    Each value the defaults do not give is marked with what set it: (recipe), (FILE:LINE), (-o) or the flag.
    They layer in that order, each over the ones before it: defaults < recipe < FILE < -o < --method/--recipe."""
    from thinkrl.config.describe import describe, set_by
    from thinkrl.methods import load_plugins
    from thinkrl.settings import applied_recipe, load_config, recipe_flag, recipe_report, resolve_with_method

    if plugins:
        load_plugins(plugins)
    check_override_spacing(override, file)
    path = one_config(file, config_option)
    cfg = load_config(path, override, recipe=recipe_flag(recipe, no_recipe), **({"method.name": method} if method else {}))
    applied, report, output_dir = applied_recipe(cfg), recipe_report(cfg), cfg.output_dir
    cfg, m = resolve_with_method(cfg)  # the checks across sections a run makes, and its derived values
    cfg.output_dir = output_dir  # the default name is made when a run starts
    flags = {"method.name": "--method"} if method else {}
    if recipe is not None or no_recipe:
        flags["method.recipe"] = "--no-recipe" if no_recipe else "--recipe"
    args = [*([str(path)] if path else []), *(["--method", method] if method else []), *(["--recipe", recipe] if recipe else [])]
    args += [*(["--no-recipe"] if no_recipe else []), *(a for o in override for a in ("-o", o))]
    args += ["--plugins", str(plugins)] if plugins else []
    print(describe(cfg, m, report, shlex.join(["thinkrl", "train", *args]), set_by(path, override, flags, applied)))


def one_config(positional: Path | None, option: Path | None) -> Path | None:
    """CONFIG or --config CONFIG (as `thinkrl eval --config`): one of them."""
    if positional is not None and option is not None and positional != option:
        raise UserError(f"{positional} and --config {option}: name one config file (CONFIG or --config CONFIG)")
    return positional or option


def check_override_spacing(overrides: list[str], config: Path | None) -> None:
    """`-o train.lr 1e-5` hands 1e-5 to CONFIG: say what happened instead of "config file not found"."""
    bare = next((o for o in overrides if "=" not in o), None)
    if bare is not None:
        after = f" {config}" if config is not None and not config.exists() else ""
        raise UserError(f"-o {bare}{after}: write each override as one argument KEY=VALUE, e.g. -o {bare}={str(config or 'VALUE')}")
