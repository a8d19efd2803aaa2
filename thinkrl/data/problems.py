"""A problem is {id, problem, answer}; what loading a dataset returns and how gold answers are cleaned."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any


@dataclass
class Problem:
    id: str
    problem: str
    answer: str


@dataclass
class Loaded:
    problems: list[Problem]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    where: dict[str, str] = field(default_factory=dict)  # reason -> where those rows are: "d.jsonl, lines 3, 9 and 2 more"
    origin: str = ""  # what was read: a file's path, package:ALIAS (shipped with thinkrl), hub:ID or builtin:arith
    sha256: str | None = None  # of that file's bytes (None: the hub or the built-in task)
    warnings: list[str] = field(default_factory=list)  # one line each, for the caller to print


SHOWN_POSITIONS = 5  # a skip report names this many rows, then counts the rest


def positions(source: str, where: list[str]) -> str:
    """'d.jsonl', ['line 3', 'line 9', ...] -> 'd.jsonl, lines 3, 9, 12, 15, 20 and 4 more': the first few
    places (all of one kind: line, item or row), then a count, so a file of broken rows stays one line."""
    unit, numbers = where[0].split()[0], [w.split()[-1] for w in where[:SHOWN_POSITIONS]]
    more = f" and {len(where) - SHOWN_POSITIONS} more" if len(where) > SHOWN_POSITIONS else ""
    return f"{source}, {unit}{'s' if len(where) > 1 else ''} {', '.join(numbers)}{more}"


def normalise_answer(value: Any) -> str | None:
    """Gold answers as clean strings: 27.0 -> '27', ' 5 ' -> '5'; None / '' -> None."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if re.fullmatch(r"-?\d+\.0+", text):
        text = text.split(".")[0]
    return text or None


def is_math_value(value: Any) -> bool:
    """Whether a gold answer can be one at all: text or a finite number. Not: NaN or an infinite float
    (JSON NaN / Infinity, a parquet or pandas gap), a boolean (JSON true), a list or an object (JSON [2],
    {...}), or the text 'nan'; as strings they would read "nan", "inf", "[2]", "True", and the verifier
    accepts \\boxed{nan}, \\boxed{\\infty} and \\boxed{2} for the first three. The text 'inf' stays an answer
    (infinity, as written by the data's author)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        return value.strip().lower().lstrip("+-") != "nan"
    if isinstance(value, numbers.Real):  # int, float, numpy's numbers
        return math.isfinite(value)
    return isinstance(value, Decimal) and value.is_finite()  # a parquet decimal column
