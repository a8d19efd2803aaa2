"""`thinkrl config [--method NAME] [--recipe NAME]`: every key with the value a run would use and its doc line, and
the line a run prints about the recipe it applied."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from thinkrl.config import Config, MethodSection
from thinkrl.config.load import MethodSpec, recipe_source
from thinkrl.config.typecheck import field_docs


def describe(cfg: Config, m: MethodSpec, recipe: Mapping[str, Any], report: str, named: bool) -> str:
    """Every key of `cfg` with its value and doc line, the keys `recipe` (the applied one) set marked, `report`
    (recipe_line's) in the header; `named`: the user passed --method."""
    source = recipe_source(cfg.method.name, cfg.method.recipe)
    marked = set(recipe)
    lines = [f"# the config `thinkrl train{f' --method {cfg.method.name}' if named else ''}` starts from; set a key with -o KEY=VALUE"]
    if source is not None:
        lines += [f"# (recipe) = set by the {source} recipe; --recipe none leaves those at their defaults"]
    lines += [f"# {report}", ""]
    docs = field_docs(MethodSection)
    lines.append(_line("method.name", cfg.method.name, docs["name"], marked))
    lines.append(_line("method.recipe", cfg.method.recipe, docs["recipe"], marked))
    method_docs = field_docs(m.Config)
    for key, value in m.config_dict().items():
        lines.append(_line(f"method.{key}", value, method_docs.get(key, ""), marked))
    lines += _section(cfg, "", marked)
    return "\n".join(lines)


def value_at(cfg: Config, dotted: str) -> Any:
    """The value of one dotted key; `method.<x>` is the method's parameter x."""
    section, _, rest = dotted.partition(".")
    if section == "method":
        return cfg.method.params.get(rest)
    obj: Any = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def recipe_line(cfg: Config, recipe: Mapping[str, Any], left_out: tuple[str, ...] = ()) -> str:
    """What the recipe did to this run, every key with the value the run uses (and the recipe's own where the
    file or -o changed it), and the keys of another method's recipe left out (its loss's own parameters); or,
    plainly, that no recipe applied or the recipe is empty."""
    source = recipe_source(cfg.method.name, cfg.method.recipe)
    if source is None:
        return "recipe: none (method.recipe is none: thinkrl's defaults, then your file and -o)"
    if not recipe and not left_out:
        return f"recipe: {source}'s is empty (its paper's regime is thinkrl's defaults)"
    parts = []
    for key, value in recipe.items():
        now = value_at(cfg, key)
        parts.append(f"{key}={now}" + (f" (recipe: {value}, yours wins)" if now != value else ""))
    foreign = "" if source == cfg.method.name else f" (the regime of {source}, applied to {cfg.method.name})"
    skipped = f"; left out, as {source}'s loss's own parameters: {', '.join(left_out)}" if left_out else ""
    return f"recipe {source}{foreign}: " + ", ".join(parts) + skipped


def _section(obj: Any, prefix: str, recipe: set[str]) -> list[str]:
    lines = []
    docs = field_docs(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, MethodSection):
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            lines += ["", f"[{key}]"] if not prefix else []
            lines += _section(value, key + ".", recipe)
        else:
            lines.append(_line(key, value, docs.get(f.name, ""), recipe))
    return lines


def _line(key: str, value: Any, doc: str, recipe: set[str]) -> str:
    mark = "  (recipe)" if key in recipe else ""
    return f"{key} = {value!r}{mark}    {doc}".rstrip()
