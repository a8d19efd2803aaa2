"""The console: one rich Console on stderr (stdout stays for machine-readable output such as --json),
the progress bar of long work, the one-line step summary, and `printable` / `shown` for text that came from
a model or a data file (terminal escapes made visible, rich markup left uninterpreted)."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True, highlight=False)

# C0 controls but newline and tab (ESC among them), DEL, C1 (a lone 0x9b is CSI to some terminals), and the
# bidirectional overrides and isolates, which reorder what a line appears to say ("Trojan source")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: Any) -> str:
    """Model output or data, safe to print: each control character is shown as its escape (ESC as the four
    characters \\x1b), so a completion or a data row cannot set the window title, clear the screen, move the
    cursor or write the clipboard (OSC 52). Newlines and tabs are kept."""
    text = str(text)

    def visible(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _CONTROL.sub(visible, text)


def shown(text: Any) -> str:
    """`printable(text)` for a rich markup string: its own '[...]' is printed as written, never as markup."""
    return escape(printable(text))


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
    (no signal: zero advantages) are the first things to read when a run learns nothing. A step that ran no
    update (dynamic sampling kept no group) says so instead of showing numbers it did not measure; grader and
    reward-function calls that failed and scored 0 (below the share that stops the run) are counted at the end."""
    if "sampling/rounds" in m and "update/optimizer_steps" not in m:
        why = "no group had" if not m.get("sampling/kept_groups") else "a process kept no group with"
        line = (
            f"step {m['step']:>4}/{total}  nothing trained: {why} a reward spread after {m['sampling/rounds']:.0f} sampling "
            f"round(s) ({m['sampling/dropped_groups']:.0f} groups dropped)  gen {m['time/generate']:.1f}s"
        )
    else:
        line = (
            f"step {m['step']:>4}/{total}  reward {m['reward/mean']:.3f}  zero-std groups {m['frac_reward_zero_std']:.2f}  "
            f"loss {m['loss']:+.4f}  grad_norm {m['grad_norm']:.3f}  entropy {m['entropy']:.3f}  len {m['length/mean']:.1f}  "
            f"gen {m['time/generate']:.1f}s upd {m['time/update']:.1f}s  {m['tokens/s']:.0f} tok/s"
        )
    failed = {k: m.get(f"verifier/{k}", 0) for k in ("errors", "timeouts", "crashes")}
    if sum(failed.values()):
        line += f"  failed calls scored 0: {', '.join(f'{v:.0f} {k}' for k, v in failed.items() if v)}"
    return line
