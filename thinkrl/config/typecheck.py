"""Strict value coercion against type hints, range checks, and field docs read from attribute docstrings.

Shared by the run config (`configure.py`) and each method's own `Config` (`methods/`), so that a bad
`-o key=value` is rejected the same way everywhere: the message names the key and the value.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import textwrap
import types
import typing
from typing import Any, Literal, Union

from thinkrl.errors import UserError, short


# over 60 lines: one branch per form a config type takes (Any, unions, Literal, containers, dataclasses, scalars)
def coerce(value: Any, tp: Any, where: str) -> Any:
    """Return `value` converted to type `tp`, or raise a UserError naming `where` and the value."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, where)
            except UserError as e:
                errors.append(str(e))
        raise UserError(errors[0] if len(errors) == 1 else f"{where}: {short(value)} is not a valid {_name(tp)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        raise UserError(f"{where}: {short(value)} is not one of {', '.join(map(repr, choices))}")
    if origin in (list, tuple):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):  # `-o eval.datasets=aime24,aime25`
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {short(value)}")
        return [coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {short(value)}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int past 1.8e308
                raise UserError(f"{where}: {short(value)} is too large for a number (the largest is about 1.8e308)") from None
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):  # an entry of a list such as reward.functions
            return build(tp, value, f"{where}.")
        keys = ", ".join(f.name for f in dataclasses.fields(tp))
        raise UserError(f"{where}: expected a mapping of {keys}, got {short(value)} ({type(value).__name__})")
    else:
        raise TypeError(f"unsupported config type {tp!r} at {where}")
    raise UserError(f"{where}: expected {_name(tp)}, got {short(value)} ({type(value).__name__})")


def _name(tp: Any) -> str:
    """How a type reads in an error: `bool`, `'auto'`, `bool or 'auto'`."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_name(arg) for arg in typing.get_args(tp) if arg is not type(None))
    if typing.get_origin(tp) is Literal:
        return " or ".join(map(repr, typing.get_args(tp)))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass (handles `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def closest(key: str, candidates: list[str]) -> str:
    """' (did you mean X?)' for the nearest candidate, or '' when nothing is close."""
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    return f" (did you mean {match[0]}?)" if match else ""


def build(cls: type, values: dict[str, Any], where: str) -> Any:
    """Instantiate dataclass `cls` from a dict, strictly: unknown keys and wrong types are errors."""
    types_ = hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise UserError(f"unknown key {where}{key}{closest(key, names)}; valid keys: {', '.join(names)}")
    kwargs = {k: coerce(v, types_[k], f"{where}{k}") for k, v in values.items()}
    try:
        obj = cls(**kwargs)
    except ValueError as e:  # __post_init__ range checks
        raise UserError(f"{where.rstrip('.') or cls.__name__}: {e}") from None
    check_finite(obj, where)
    return obj


def check_finite(obj: Any, where: str) -> None:
    """Refuse NaN and infinity in every float field of dataclass `obj` (a float, or one in a list), whatever its
    own checks say: a NaN passes no comparison the way a range check expects, and an infinite temperature,
    timeout or learning rate runs and learns nothing, or fails far from the setting. A class lets +inf through
    for the fields it names in `allow_inf` (a documented 'inf = off'). The UserError names the key, the value
    and the field's doc line; run it after the class's own checks, whose messages name the range."""
    allowed = getattr(obj, "allow_inf", ())
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, float) and not math.isfinite(v) and not (v == math.inf and f.name in allowed):
                doc = field_docs(type(obj)).get(f.name, "")
                raise UserError(f"{where}{f.name}: {v} is not a finite number; give a finite value{f' ({doc})' if doc else ''}")


def field_docs(cls: type) -> dict[str, str]:
    """Map field name -> the docstring written on the line after it (cleanrl style)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def check(*rules: tuple[bool, str]) -> None:
    """Raise ValueError with the message of the first rule that does not hold (config __post_init__ checks)."""
    for ok, message in rules:
        if not ok:
            raise ValueError(message)
