"""`thinkrl config [FILE] [--method NAME] [--recipe NAME] [-o KEY=VALUE]`: every key with the value a run would use
and its doc line, each value the defaults do not give marked with what set it (`set_by`: the recipe, the file's
line, -o or a flag), and the line a run prints about the recipe it applied."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from thinkrl.config import Config, MethodSection
from thinkrl.config.files import read_yaml
from thinkrl.config.load import MethodSpec, flatten, parse_override, recipe_source
from thinkrl.config.typecheck import field_docs


def describe(cfg: Config, m: MethodSpec, report: str, command: str, sources: Mapping[str, str]) -> str:
    """Every key of `cfg` (resolved) with its value and doc line, each key in `sources` (set_by's) marked with what
    set it, `report` (recipe_line's) in the header; `command`: the `thinkrl train` line that runs this config."""
    source = recipe_source(cfg.method.name, cfg.method.recipe)
    lines = [f"# the config `{command}` runs with; set a key with -o KEY=VALUE"]
    if source is not None:
        lines += [f"# (recipe) = set by the {source} recipe; --recipe none leaves those at their defaults"]
    if any(where != "recipe" for where in sources.values()):
        lines += [
            "# (FILE:LINE) = set in your file, (-o) = by an override, (--method) / (--recipe) = by that flag; each wins over "
            "those before it: defaults < recipe < file < -o < flag"
        ]
    lines += [f"# {report}", ""]
    docs = field_docs(MethodSection)
    lines.append(_line("method.name", cfg.method.name, docs["name"], sources))
    lines.append(_line("method.recipe", cfg.method.recipe, docs["recipe"], sources))
    method_docs = field_docs(m.Config)
    for key, value in {**m.config_dict(), **cfg.method.params}.items():  # resolved params where cfg holds them
        lines.append(_line(f"method.{key}", value, method_docs.get(key, ""), sources))
    lines += _section(cfg, "", sources)
    return "\n".join(lines)


def set_by(path: Path | None, overrides: list[str], flags: Mapping[str, str], recipe: Mapping[str, Any]) -> dict[str, str]:
    """{dotted key: what set it last} in load_config's order: the applied `recipe` ("recipe"), then the file
    ("FILE:LINE"), the `-o` overrides ("-o"), the CLI `flags` ({key: "--flag"}). A mapping written for a section
    (`-o model.lora={rank: 8}`) counts for each key it holds."""
    out = dict.fromkeys(recipe, "recipe")
    layers = [(key, value, f"{path}:{line}") for key, value, line in read_yaml(Path(path))] if path is not None else []
    layers += [(*parse_override(text), "-o") for text in overrides]
    layers += [(key, None, flag) for key, flag in flags.items()]
    for key, value, where in layers:
        if key == "method.params" and isinstance(value, dict):
            out.update(dict.fromkeys((f"method.{k}" for k in value), where))
        elif isinstance(value, dict) and not key.startswith("method."):
            out.update(dict.fromkeys((k for k, _ in flatten(value, key + ".")), where))
        else:
            out[key] = where
    return out


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


def _section(obj: Any, prefix: str, sources: Mapping[str, str]) -> list[str]:
    lines = []
    docs = field_docs(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, MethodSection):
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            lines += ["", f"[{key}]"] if not prefix else []
            lines += _section(value, key + ".", sources)
        else:
            lines.append(_line(key, value, docs.get(f.name, ""), sources))
    return lines


def _line(key: str, value: Any, doc: str, sources: Mapping[str, str]) -> str:
    mark = f"  ({sources[key]})" if key in sources else ""
    return f"{key} = {value!r}{mark}    {doc}".rstrip()
