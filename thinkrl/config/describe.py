"""`thinkrl config [--method NAME]`: every key with the value a run would use and its doc line."""

from __future__ import annotations

import dataclasses
from typing import Any

from thinkrl.config import Config, MethodSection
from thinkrl.config.load import MethodSpec
from thinkrl.config.typecheck import field_docs


def describe(cfg: Config, m: MethodSpec, named: bool) -> str:
    """Every key of `cfg` (loaded with method `m`'s recipe) with its value and doc line; `named`: the user
    passed --method."""
    recipe = set(m.recipe) if cfg.method.recipe else set()
    lines = [f"# the config `thinkrl train{f' --method {cfg.method.name}' if named else ''}` starts from; set a key with -o KEY=VALUE"]
    lines += [f"# (recipe) = set by the {cfg.method.name} recipe; --no-recipe leaves those at their defaults", ""]
    docs = field_docs(MethodSection)
    lines.append(_line("method.name", cfg.method.name, docs["name"], recipe))
    lines.append(_line("method.recipe", cfg.method.recipe, docs["recipe"], recipe))
    method_docs = field_docs(m.Config)
    for key, value in m.config_dict().items():
        lines.append(_line(f"method.{key}", value, method_docs.get(key, ""), recipe))
    lines += _section(cfg, "", recipe)
    return "\n".join(lines)


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
