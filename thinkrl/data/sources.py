"""Where problems come from: the built-in task, local files, dataset aliases or hub ids.

Sources, by `data.name`:
  arith              built-in, seeded arithmetic ("What is 27 + 82?"); train and test splits are disjoint
  a dataset alias    gsm8k, math, math500, aime24, aime25, amc23, dapo17k (hub ids and columns below), read
                     from the first of: $THINKRL_DATA_DIR/<alias>_<split>.jsonl or <alias>.jsonl, the copy
                     shipped in thinkrl/data/benchmarks/ (aime24, aime25, amc23, math500), the hub (data/hub.py)
  a file             .jsonl / .json / .parquet / .csv with problem/answer columns (names configurable)
  anything else      a Hugging Face dataset id (needs the hub; a clear error when it is unreachable)
Rows with a missing answer or problem, or a gold answer that is no math value (NaN, a list, a boolean:
thinkrl.data.problems.is_math_value), and unreadable lines are skipped and counted (Loaded.skipped), with the
file and the first few of their line numbers (Loaded.where), so a broken row can be found and fixed. Ids must be unique: pass@k and
maj@n group samples by id, so two different problems with one id are refused (naming both rows), and a row
that repeats another (id, problem and answer) is dropped and counted. Text files are read as UTF-8 with or
without a byte-order mark.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thinkrl.config import DataConfig
from thinkrl.data.arith import arith_problems
from thinkrl.data.benchmarks import origin, row_count_warning, shipped_file
from thinkrl.data.hub import read_hub
from thinkrl.data.problems import Loaded, Problem, is_math_value, normalise_answer, positions
from thinkrl.errors import UserError


def _gsm8k_answer(text: str) -> str:
    return text.split("####")[-1].strip().replace(",", "")


def _boxed_in_solution(text: str) -> str:
    from thinkrl.verifier import extract_boxed

    return extract_boxed(text) or ""


@dataclass
class HubSpec:
    path: str
    split: str
    problem_key: str = "problem"
    answer_key: str = "answer"
    subset: str | None = None
    answer_fn: Callable[[str], str] | None = None


ALIASES: dict[str, HubSpec] = {
    "gsm8k": HubSpec("openai/gsm8k", "test", "question", "answer", subset="main", answer_fn=_gsm8k_answer),
    "math": HubSpec("DigitalLearningGmbH/MATH-lighteval", "train", "problem", "solution", answer_fn=_boxed_in_solution),
    "math500": HubSpec("HuggingFaceH4/MATH-500", "test"),
    "aime24": HubSpec("HuggingFaceH4/aime_2024", "train"),
    "aime25": HubSpec("yentinglin/aime_2025", "train"),
    "amc23": HubSpec("math-ai/amc23", "test", "question"),
    "dapo17k": HubSpec("open-r1/DAPO-Math-17k-Processed", "train", "prompt", "solution", subset="en"),
}


# ---------------------------------------------------------------- files and the hub


ROW_HELP = 'expected one JSON object per line, e.g. {"problem": "What is 2 + 3?", "answer": "5"}'


def _read_file(path: Path) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Rows of a local file, where its unreadable lines are (skipped and counted, unless none is readable),
    and where each row is in the file, for messages about one row: 'line 7' (counted from 1, as editors do),
    or the index of a JSON list's 'item 3' or a parquet table's 'row 3' (counted from 0, as Python does)."""
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".csv", ".parquet"):
        raise UserError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json, .parquet or .csv")
    try:
        return _parse_file(path, suffix)
    except UserError:
        raise
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); re-save the file as UTF-8") from e
    except Exception as e:  # a corrupt parquet file, a CSV the csv module rejects, an unreadable file
        raise UserError(f"{path}: could not read it as {suffix[1:]}: {type(e).__name__}: {str(e).strip()[:200]}") from e


def _parse_file(path: Path, suffix: str) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    # utf-8-sig: a byte-order mark (Excel, Notepad) is not part of the first line's JSON or the first column's name
    if suffix == ".jsonl" or (suffix == ".json" and not path.read_text(encoding="utf-8-sig").lstrip()[:1] == "["):
        rows, bad, first_bad, where = [], [], None, []
        for n, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                row, why = None, e.msg
            else:
                why = f"a JSON {type(row).__name__}, not an object"
            if isinstance(row, dict):
                rows.append(row)
                where.append(f"line {n}")
            else:
                bad.append(f"line {n}")
                first_bad = first_bad or (n, why)
        if bad and not rows:  # nothing to skip *to*: the file is not JSON lines at all
            raise UserError(f"{path}, line {first_bad[0]}: {first_bad[1]}; no line of the file is a JSON object ({ROW_HELP})")
        return rows, bad, where
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}, line {e.lineno} column {e.colno}: malformed JSON ({e.msg}); expected a list of objects, or JSON lines"
            ) from e
        items = [(i, r) for i, r in enumerate(data) if isinstance(r, dict)]
        bad = [f"item {i}" for i, r in enumerate(data) if not isinstance(r, dict)]
        return [r for _, r in items], bad, [f"item {i}" for i, _ in items]
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows, where = [], []
            for row in reader:
                rows.append(row)
                where.append(f"line {reader.line_num}")
            return rows, [], where
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return rows, [], [f"row {i}" for i in range(len(rows))]


def _local_alias(name: str, split: str) -> Path | None:
    """$THINKRL_DATA_DIR/<alias>.jsonl (or <alias>_<split>.jsonl, or .parquet): offline copies of aliases."""
    root = os.environ.get("THINKRL_DATA_DIR")
    if not root:
        return None
    for stem in (f"{name}_{split}", name):
        for suffix in (".jsonl", ".parquet"):
            path = Path(root).expanduser() / f"{stem}{suffix}"
            if path.is_file():
                return path
    return None


def _alias_rows(name: str, split: str | None, flag: str):
    """An alias's rows, unreadable lines, row places, the file read (None: the hub) and warnings, from the first
    of: $THINKRL_DATA_DIR's copy, the copy shipped with thinkrl (the alias's own split only), the hub. A copy of
    a known benchmark with another row count than the benchmark's is used, with a one-line warning."""
    spec = ALIASES[name]
    own = split in (None, spec.split)
    local = _local_alias(name, split or spec.split) or (shipped_file(name) if own else None)
    if local is None:
        return read_hub(spec.path, spec.subset, split or spec.split, name, flag, alias=True), [], None, None, []
    rows, bad, where = _read_file(local)
    warning = row_count_warning(name, len(rows) + len(bad), str(local)) if own else None
    return rows, bad, where, local, [warning] if warning else []


def _duplicate_id(name: str, pid: str, here: str, first: str, numbered: bool) -> str:
    how = " (a row without an id is numbered by its position, counted from 0)" if numbered else ""
    return (
        f"dataset {name}: id {pid!r} at {here} is also the id of a different problem at {first}{how}; pass@k, maj@n "
        "and resuming tell problems apart by id, so give each problem its own id (or leave the id field out of every row)"
    )


def _problems(name: str, rows: list[dict], where: list[str], problem_key: str, answer_key: str, answer_fn, limit: int, skipped: dict):
    """The usable problems of `rows` (at most `limit`; 0: all), listing where each skipped row is by why in
    `skipped` (reason -> places); an id that names two different problems fails in one line naming both rows."""
    problems, seen = [], {}  # seen: id -> (problem, answer, where, whether the row named its id)
    for i, row in enumerate(rows):
        raw = row.get(answer_key)
        value = answer_fn(raw) if (answer_fn and raw is not None) else raw
        answer = normalise_answer(value) if is_math_value(value) else None
        text = row.get(problem_key)
        why = None
        if value is None or (answer is None and is_math_value(value)):
            why = "missing answer"
        elif answer is None:
            why = "answer not a math value"  # NaN, inf, [2], true, {...}: text no grader should compare with
        elif not isinstance(text, str) or not text.strip():
            why = "missing problem"
        else:
            named = row.get("id") is not None
            pid = str(row["id"] if named else i)
            if pid not in seen:
                seen[pid] = (text, answer, where[i], named)
                problems.append(Problem(id=pid, problem=text, answer=answer))
            elif seen[pid][:2] == (text, answer):
                why = "duplicate row"  # the same problem twice would count twice in every metric
            else:
                raise UserError(_duplicate_id(name, pid, where[i], seen[pid][2], not (named and seen[pid][3])))
        if why:
            skipped.setdefault(why, []).append(where[i])
        if limit and len(problems) >= limit:
            break
    return problems


def load_problems(cfg: DataConfig, split: str | None = None, flag: str = "data.name") -> Loaded:
    """Problems of `cfg.name` for `split` (default: cfg.split, or the alias' own split). flag: the option that
    names the dataset in the asking command ('--dataset' for eval), for the fix in a hub error."""
    name = cfg.name
    if name == "arith":
        problems = arith_problems(cfg.arith, split or cfg.split or "train")
        return Loaded(problems[: cfg.limit] if cfg.limit else problems, origin="builtin:arith")
    answer_fn, where, source = None, None, name  # source: what the rows were read from, for the skip report
    problem_key, answer_key = cfg.problem_key, cfg.answer_key
    path = Path(name).expanduser()
    bad: list[str] = []  # where the unreadable lines are
    file, hub, warnings = None, name, []  # the file read (None: hub id `hub`), one-line warnings for the caller
    if path.is_file():
        rows, bad, where = _read_file(path)
        file = path
    elif name in ALIASES:
        spec = ALIASES[name]
        rows, bad, where, file, warnings = _alias_rows(name, split, flag)
        source, hub = str(file or spec.path), spec.path + (f" ({spec.subset})" if spec.subset else "")
        if rows and spec.problem_key in rows[0] and spec.answer_key in rows[0]:  # the hub's own columns
            problem_key, answer_key, answer_fn = spec.problem_key, spec.answer_key, spec.answer_fn
        else:  # a prepared {problem, answer} copy
            problem_key, answer_key = "problem", "answer"
    elif path.is_dir():
        raise UserError(f"data.name={name} is a directory; pass one .jsonl/.json/.parquet/.csv file")
    elif path.suffix in (".jsonl", ".json", ".parquet", ".csv") or name.startswith((".", "/", "~")):
        raise UserError(f"dataset file not found: {name} (data.name / --dataset; relative paths start from {Path.cwd()})")
    else:
        rows = read_hub(name, cfg.subset, split or cfg.split or "train", name, flag)
    if not rows:
        raise UserError(f"dataset {name} has no rows; {ROW_HELP}")
    where = where or [f"row {i}" for i in range(len(rows))]
    columns = list(dict.fromkeys(k for row in rows[:100] for k in row))  # a first row may lack an optional field
    for key, option in ((problem_key, "data.problem_key"), (answer_key, "data.answer_key")):
        if not any(key in row for row in rows):
            raise UserError(  # repr: a stray byte-order mark, space or control character in a name shows
                f"dataset {name} has no column {key!r} (columns: {', '.join(map(repr, columns))}); set {option} to the right one"
            )
    skipped = {"unreadable row": bad} if bad else {}  # reason -> where each such row is
    problems = _problems(name, rows, where, problem_key, answer_key, answer_fn, cfg.limit, skipped)
    counts = {why: len(places) for why, places in skipped.items()}
    if not problems:
        raise UserError(f"dataset {name}: every row was skipped ({counts}); check data.problem_key / data.answer_key")
    where_skipped = {why: positions(source, places) for why, places in skipped.items()}
    return Loaded(problems, counts, where_skipped, warnings=warnings, **origin(name, file, hub))
