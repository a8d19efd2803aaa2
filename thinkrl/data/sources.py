"""Where problems come from: the built-in task, local files, dataset aliases or hub ids.

Sources, by `data.name`:
  arith              built-in, seeded arithmetic ("What is 27 + 82?"); train and test splits are disjoint
  a dataset alias    gsm8k, math, math500, aime24, aime25, amc23, dapo17k (hub ids and columns below);
                     $THINKRL_DATA_DIR/<alias>.jsonl or <alias>_<split>.jsonl is used instead when present
  a file             .jsonl / .json / .parquet / .csv with problem/answer columns (names configurable)
  anything else      a Hugging Face dataset id (needs the hub; a clear error when it is unreachable)
Rows with a missing answer or problem are skipped and counted (Loaded.skipped).
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
from thinkrl.data.problems import Loaded, Problem, normalise_answer
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


def _read_file(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows of a local file and the number of unreadable lines (skipped and counted, unless none is readable)."""
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


def _parse_file(path: Path, suffix: str) -> tuple[list[dict[str, Any]], int]:
    if suffix == ".jsonl" or (suffix == ".json" and not path.read_text()[:1].lstrip() == "["):
        rows, bad, first_bad = [], 0, None
        for n, line in enumerate(path.read_text().splitlines(), 1):
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
            else:
                bad += 1
                first_bad = first_bad or (n, why)
        if bad and not rows:  # nothing to skip *to*: the file is not JSON lines at all
            raise UserError(f"{path}, line {first_bad[0]}: {first_bad[1]}; no line of the file is a JSON object ({ROW_HELP})")
        return rows, bad
    if suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}, line {e.lineno} column {e.colno}: malformed JSON ({e.msg}); expected a list of objects, or JSON lines"
            ) from e
        return [r for r in data if isinstance(r, dict)], sum(not isinstance(r, dict) for r in data)
    if suffix == ".csv":
        with path.open(newline="") as f:
            return list(csv.DictReader(f)), 0
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist(), 0


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


def _read_hub(spec_path: str, subset: str | None, split: str) -> list[dict[str, Any]]:
    try:
        import datasets

        datasets.disable_progress_bars()  # thinkrl's own display says what it loads
        ds = datasets.load_dataset(spec_path, subset, split=split)
    except Exception as e:  # network, missing split, private repo: all end up here
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UserError(
            f"could not load dataset '{spec_path}' (split {split!r}) from the Hugging Face Hub: {first}. "
            "If the hub is unreachable, download it elsewhere and pass a local .jsonl/.parquet file as data.name"
        ) from None
    return list(ds)


def load_problems(cfg: DataConfig, split: str | None = None) -> Loaded:
    """Problems of `cfg.name` for `split` (default: cfg.split, or the alias' own split)."""
    name = cfg.name
    if name == "arith":
        problems = arith_problems(cfg.arith, split or cfg.split or "train")
        return Loaded(problems[: cfg.limit] if cfg.limit else problems)
    answer_fn, skipped = None, {}
    problem_key, answer_key = cfg.problem_key, cfg.answer_key
    path = Path(name).expanduser()
    if path.is_file():
        rows, bad = _read_file(path)
        if bad:
            skipped["unreadable row"] = bad
    elif name in ALIASES:
        spec = ALIASES[name]
        local = _local_alias(name, split or spec.split)
        rows, bad = _read_file(local) if local else (_read_hub(spec.path, spec.subset, split or spec.split), 0)
        if bad:
            skipped["unreadable row"] = bad
        if rows and spec.problem_key in rows[0] and spec.answer_key in rows[0]:  # the hub's own columns
            problem_key, answer_key, answer_fn = spec.problem_key, spec.answer_key, spec.answer_fn
        else:  # a prepared {problem, answer} copy
            problem_key, answer_key = "problem", "answer"
    elif path.is_dir():
        raise UserError(f"data.name={name} is a directory; pass one .jsonl/.json/.parquet/.csv file")
    elif path.suffix in (".jsonl", ".json", ".parquet", ".csv") or name.startswith((".", "/", "~")):
        raise UserError(f"dataset file not found: {name} (data.name / --dataset; relative paths start from {Path.cwd()})")
    else:
        rows = _read_hub(name, cfg.subset, split or cfg.split or "train")
    if not rows:
        raise UserError(f"dataset {name} has no rows; {ROW_HELP}")
    columns = list(dict.fromkeys(k for row in rows[:100] for k in row))  # a first row may lack an optional field
    for key, option in ((problem_key, "data.problem_key"), (answer_key, "data.answer_key")):
        if not any(key in row for row in rows):
            raise UserError(
                f"dataset {name} has no column '{key}' (columns: {', '.join(map(str, columns))}); set {option} to the right one"
            )
    problems = []
    for i, row in enumerate(rows):
        raw = row.get(answer_key)
        answer = normalise_answer(answer_fn(raw) if (answer_fn and raw is not None) else raw)
        text = row.get(problem_key)
        if answer is None:
            skipped["missing answer"] = skipped.get("missing answer", 0) + 1
        elif not isinstance(text, str) or not text.strip():
            skipped["missing problem"] = skipped.get("missing problem", 0) + 1
        else:
            problems.append(Problem(id=str(row.get("id", i)), problem=text, answer=answer))
        if cfg.limit and len(problems) >= cfg.limit:
            break
    if not problems:
        raise UserError(f"dataset {name}: every row was skipped ({skipped}); check data.problem_key / data.answer_key")
    return Loaded(problems, skipped)
