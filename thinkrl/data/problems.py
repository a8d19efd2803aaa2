"""A problem is {id, problem, answer}; what loading a dataset returns and how gold answers are cleaned."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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
