"""The console: one rich Console on stderr (stdout stays for machine-readable output such as --json),
the progress bar of long work, and the one-line step summary."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True, highlight=False)


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
    """One readable console line per step. grad_norm and the share of groups whose rewards were all equal
    (no signal: zero advantages) are the first things to read when a run learns nothing."""
    return (
        f"step {m['step']:>4}/{total}  reward {m['reward/mean']:.3f}  zero-std groups {m['frac_reward_zero_std']:.2f}  "
        f"loss {m['loss']:+.4f}  grad_norm {m['grad_norm']:.3f}  entropy {m['entropy']:.3f}  len {m['length/mean']:.1f}  "
        f"gen {m['time/generate']:.1f}s upd {m['time/update']:.1f}s  {m['tokens/s']:.0f} tok/s"
    )
