"""Run-directory logs: metrics.jsonl (one object per step), rollouts.jsonl, and the console.

metrics.jsonl is the source of truth for a run. Lines are flushed as they are written, and on resume the
lines past the checkpoint being resumed are dropped, so the file always holds one line per step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True, highlight=False)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the information as text
    return value


class JsonlLog:
    """Append-only JSON-lines file with one record per line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        """Keep only records with record['step'] <= step (used when resuming)."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, records: list[dict[str, Any]] | dict[str, Any]) -> None:
        if isinstance(records, dict):
            records = [records]
        with self.path.open("a") as f:
            for r in records:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def step_line(m: dict[str, Any], total: int) -> str:
    """One readable console line per step."""
    return (
        f"step {m['step']:>4}/{total}  reward {m['reward/mean']:.3f}  loss {m['loss']:+.4f}  "
        f"entropy {m['entropy']:.3f}  len {m['length/mean']:.1f}  "
        f"gen {m['time/generate']:.1f}s upd {m['time/update']:.1f}s  {m['tokens/s']:.0f} tok/s"
    )
