"""Run-directory logs: metrics.jsonl (one object per step) and rollouts.jsonl, kill-safe JSON lines.

metrics.jsonl is the source of truth for a run. Lines are on disk (fsync) before the step's checkpoint is,
and on resume the lines past the checkpoint being resumed are dropped, so after any kill and resume the file
holds exactly one line per step.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the information as text
    return value


def _parse(text: str, path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) for each line of a JSON-lines text. A last line without its newline that does not
    parse is the torn write of a killed process and is dropped; an unreadable line elsewhere is an error."""
    lines = text.split("\n")  # the element after the last newline is "" unless the tail is torn
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}, line {i + 1}: not JSON ({e}); remove or repair that line") from None
    return out


def _torn_tail(f) -> int:
    """Offset where an unterminated last line starts in binary file f (its size when the file is empty or
    ends with a newline). Reads backwards in blocks: a rollouts line can be long."""
    end = f.seek(0, os.SEEK_END)
    pos = end
    while pos > 0:
        start = max(0, pos - 65536)
        f.seek(start)
        block = f.read(pos - start)
        if pos == end and block.endswith(b"\n"):
            return end
        nl = block.rfind(b"\n")
        if nl != -1:
            return start + nl + 1
        pos = start
    return 0


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return False
    return True


class JsonlLog:
    """Append-only JSON-lines file with one record per line.

    Kill-safe: a process killed mid-write leaves at most a torn last line, which readers skip and the next
    write cuts off; truncate_after replaces the file atomically, so a kill while resuming never loses lines.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def truncate_after(self, step: int) -> None:
        """Keep only records with record['step'] <= step (used when resuming)."""
        if not self.path.exists():
            return
        text = self.path.read_text()
        records = _parse(text, self.path)
        keep = [line for line, r in records if r.get("step", 0) <= step]
        # rewrite a copy and rename it over the file: truncating in place would lose the kept lines too if
        # the process were killed halfway through writing them back
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        if len(keep) == len(records) and (not text or text.endswith("\n")):
            tmp.unlink(missing_ok=True)  # a killed truncation's leftover
            return  # nothing to drop: leave the file alone
        with tmp.open("w") as f:
            f.write("".join(line + "\n" for line in keep))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def write(self, records: list[dict[str, Any]] | dict[str, Any]) -> None:
        if isinstance(records, dict):
            records = [records]
        text = "".join(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n" for r in records)
        with self.path.open("a+b") as f:  # appends always go to the end, whatever the read position
            torn, end = _torn_tail(f), f.seek(0, os.SEEK_END)
            if torn < end:  # a killed writer's last line: appending to it would corrupt both
                f.seek(torn)
                if _is_json(f.read(end - torn)):
                    f.write(b"\n")  # only its newline was lost: keep the record
                else:
                    f.truncate(torn)  # partial: drop it, as readers do
            f.write(text.encode())
            # on disk before the checkpoint of this step is: a power cut must not leave a checkpoint newer
            # than the metrics (resume never rewrites the lines up to its step)
            f.flush()
            os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file; a torn last line (a killed writer's) is skipped."""
    return [r for _, r in _parse(Path(path).read_text(), Path(path))]
