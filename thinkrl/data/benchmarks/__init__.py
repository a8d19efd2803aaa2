"""The evaluation sets that ship inside thinkrl, so `--dataset aime24` works offline and always means the same problems.

Each alias below has a JSONL file next to this module ({id, problem, answer} per line; where the problems come
from and under which license: README.md here). An evaluation records which file it read and the sha256 of its
bytes; a copy of an alias with another number of rows than the benchmark has (a truncated or different file in
THINKRL_DATA_DIR, another version on the hub) gets a one-line warning, since its numbers compare with nobody's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
# alias -> problems in the benchmark (the file shipped here has exactly these)
KNOWN_ROWS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500}


def shipped_file(name: str) -> Path | None:
    """The packaged copy of alias `name`, or None when thinkrl ships none (gsm8k, math, dapo17k: too large)."""
    path = HERE / f"{name}.jsonl"
    return path if name in KNOWN_ROWS and path.is_file() else None


def file_sha256(path: Path) -> str:
    """sha256 of the file's bytes: what settings.json records, and what a resumed evaluation must match."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def row_count_warning(name: str, rows: int, source: str) -> str | None:
    """One line when a copy of a known benchmark has another number of rows than the benchmark; else None."""
    known = KNOWN_ROWS.get(name)
    if known is None or rows == known:
        return None
    return (
        f"{name}: {source} has {rows} rows, but {name} has {known} problems; its numbers will not compare with "
        f"published ones (remove that copy to use the one thinkrl ships)"
    )


def origin(name: str, file: Path | None, hub: str | None) -> dict:
    """Loaded.origin and .sha256: the file read (package:ALIAS for the copy shipped here) and the sha256 of its
    bytes, or the hub id (no hash: the hub's files are not ours to pin)."""
    if file is None:
        return {"origin": f"hub:{hub}", "sha256": None}
    label = f"package:{name}" if file.resolve() == shipped_file(name) else str(file.resolve())
    return {"origin": label, "sha256": file_sha256(file)}
