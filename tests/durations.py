"""The table `make test-durations` writes: every test's time (setup, call and teardown added up), slowest
first, then each file's total, from the `slowest durations` sections of pytest's output (--durations=0).

    python tests/durations.py test-durations.log > test-durations.txt
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(\S.*?)\s*$")


def read(log: str) -> dict[str, float]:
    """Seconds per test id over every durations section of `log` (several pytest runs add up)."""
    seconds: dict[str, float] = defaultdict(float)
    inside = False
    for line in log.splitlines():
        if "slowest durations" in line:
            inside = True
            continue
        m = LINE.match(line) if inside else None
        if m:
            seconds[m.group(3)] += float(m.group(1))
        elif inside and line.strip() and not line.lstrip().startswith("("):
            inside = False  # the section ended (pytest's summary follows it)
    return dict(seconds)


def table(seconds: dict[str, float]) -> str:
    files: dict[str, float] = defaultdict(float)
    for test, s in seconds.items():
        files[test.split("::")[0]] += s
    total = sum(seconds.values())
    rows = [f"{len(seconds)} tests, {total:.0f} s of test time in all (workers run side by side, so wall time is less)", ""]
    rows += ["seconds  share  file"] + [f"{s:7.1f}  {s / total:5.1%}  {f}" for f, s in sorted(files.items(), key=lambda x: -x[1])]
    rows += ["", "seconds  test"] + [f"{s:7.2f}  {t}" for t, s in sorted(seconds.items(), key=lambda x: -x[1])]
    return "\n".join(rows)


if __name__ == "__main__":
    found = read(Path(sys.argv[1]).read_text())
    if not found:
        sys.exit(f"error: no durations in {sys.argv[1]}: run pytest with --durations=0 --durations-min=0")
    print(table(found))
