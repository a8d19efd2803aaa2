"""Hostile data (issue 19, "Data and eval"): gold answers that are no math value, duplicate ids, byte-order
marks, the verifier's timeouts and crashes in eval. Each ends in rows skipped and counted, or one line that
names the value and the fix (exit 2), never a traceback or a silently wrong metric. Eval writes that fail are
in test_eval_writes.py."""

import json
import os
from pathlib import Path

import pytest
from test_cli_e2e import tiny_args
from test_faults import error_line, run_cli

from thinkrl import verifier
from thinkrl.config import DataConfig
from thinkrl.data import load_problems
from thinkrl.data.problems import is_math_value
from thinkrl.errors import UserError
from thinkrl.evaluation import evaluate as evaluate_mod
from thinkrl.run.jsonl import read_jsonl


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def eval_args(model_dir, data, out, *extra):
    return ["eval", "--model", model_dir, "--dataset", data, "--max-new-tokens", "4", "--output", out, *extra]


# ---------------------------------------------------------------- gold answers that are no math value


def test_non_math_gold_answers_are_skipped_and_counted(tmp_path):
    """json writes NaN / Infinity for floats it cannot represent; a list, a boolean or an object is no answer
    either. As text they read "nan", "inf", "[2]", "True", and \\boxed{nan}, \\boxed{\\infty} and \\boxed{2}
    each graded 1.0 against the first three."""
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"problem": "a", "answer": NaN}\n'
        '{"problem": "b", "answer": Infinity}\n'
        '{"problem": "c", "answer": -Infinity}\n'
        '{"problem": "d", "answer": [2]}\n'
        '{"problem": "e", "answer": true}\n'
        '{"problem": "f", "answer": {"value": 1}}\n'
        '{"problem": "g", "answer": "NaN"}\n'
        '{"problem": "h", "answer": null}\n'
        '{"problem": "i", "answer": "\\\\infty"}\n'
        '{"problem": "j", "answer": "inf"}\n'
        '{"problem": "k", "answer": 7.0}\n'
    )
    loaded = load_problems(DataConfig(name=str(path)))
    assert [(p.problem, p.answer) for p in loaded.problems] == [("i", "\\infty"), ("j", "inf"), ("k", "7")]
    assert loaded.skipped == {"answer not a math value": 7, "missing answer": 1}


def test_is_math_value():
    import decimal

    import numpy as np

    for ok in ("5", "\\frac{1}{2}", "inf", "True", 3, -2.5, np.int64(4), np.float32(1.5), decimal.Decimal("2.50")):
        assert is_math_value(ok), ok
    for bad in (float("nan"), float("inf"), np.float64("nan"), True, False, [2], (2,), {"a": 1}, b"2", "nan", " -NaN ", None):
        assert not is_math_value(bad), bad
    assert not is_math_value(decimal.Decimal("NaN"))


def test_parquet_and_csv_gaps_are_not_answers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["p1", "p2", "p3"], "answer": [27.0, float("nan"), None]}), tmp_path / "d.parquet")
    loaded = load_problems(DataConfig(name=str(tmp_path / "d.parquet")))
    assert [p.answer for p in loaded.problems] == ["27"]
    assert loaded.skipped == {"answer not a math value": 1, "missing answer": 1}
    (tmp_path / "d.csv").write_text("problem,answer\nq1,nan\nq2,5\n")  # pandas writes a NaN cell as nan
    loaded = load_problems(DataConfig(name=str(tmp_path / "d.csv")))
    assert [p.answer for p in loaded.problems] == ["5"] and loaded.skipped == {"answer not a math value": 1}


def test_every_answer_not_math_is_one_line(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "a", "answer": NaN}\n{"problem": "b", "answer": [1]}\n')
    code, err = run_cli(["eval", "--model", tmp_path / "no-model", "--dataset", data], capsys)
    line = error_line(err)
    assert code == 2 and "every row was skipped" in line and "answer not a math value" in line


# ---------------------------------------------------------------- duplicate ids


def test_two_problems_with_one_id_are_refused_naming_both_lines(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"id": "a", "problem": "1 + 1?", "answer": "2"},
            {"id": "b", "problem": "2 + 2?", "answer": "4"},
            {"id": "a", "problem": "3?", "answer": "3"},
        ],
    )
    with pytest.raises(
        UserError, match=r"id 'a' at line 3 is also the id of a different problem at line 1; .*give each problem its own id"
    ):
        load_problems(DataConfig(name=str(path)))


def test_an_identical_repeated_row_is_dropped_and_counted(tmp_path):
    row = {"id": 7, "problem": "1 + 1?", "answer": "2"}
    path = write_jsonl(tmp_path / "d.jsonl", [row, {"id": 8, "problem": "2 + 2?", "answer": "4"}, row])
    loaded = load_problems(DataConfig(name=str(path)))
    assert [p.id for p in loaded.problems] == ["7", "8"] and loaded.skipped == {"duplicate row": 1}


def test_an_id_equal_to_a_row_number_is_explained(tmp_path):
    """A row without an id is numbered by its position; an explicit id can collide with that number."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"problem": "1 + 1?", "answer": "2"}, {"id": 0, "problem": "2 + 2?", "answer": "4"}]))
    with pytest.raises(
        UserError, match=r"id '0' at item 1 is also the id of a different problem at item 0 \(a row without an id is numbered"
    ):
        load_problems(DataConfig(name=str(path)))


def test_csv_duplicate_names_its_line_and_null_ids_number_rows(tmp_path):
    (tmp_path / "d.csv").write_text('id,problem,answer\nx,"two\nlines",1\ny,b,2\nx,c,3\n')
    with pytest.raises(UserError, match=r"id 'x' at line 5 is also the id of a different problem at line 3"):
        load_problems(DataConfig(name=str(tmp_path / "d.csv")))
    path = write_jsonl(tmp_path / "n.jsonl", [{"id": None, "problem": "a", "answer": "1"}, {"id": None, "problem": "b", "answer": "2"}])
    assert [p.id for p in load_problems(DataConfig(name=str(path))).problems] == ["0", "1"]  # null: no id given


def test_duplicate_ids_refuse_eval_and_training_in_one_line(tmp_path, capsys, tiny_model_dir):
    data = write_jsonl(
        tmp_path / "d.jsonl", [{"id": "q", "problem": "1 + 1?", "answer": "2"}, {"id": "q", "problem": "2 + 2?", "answer": "4"}]
    )
    code, err = run_cli(eval_args(tiny_model_dir, data, tmp_path / "out"), capsys)
    assert code == 2 and "id 'q' at line 2 is also the id of a different problem at line 1" in error_line(err)
    assert not (tmp_path / "out").exists()  # refused before anything is written
    code, err = run_cli(tiny_args(tiny_model_dir, tmp_path / "run", 1, "--dataset", str(data)), capsys)
    assert code == 2 and "id 'q' at line 2" in error_line(err)


# ---------------------------------------------------------------- malformed rows: where they are


def test_malformed_lines_are_named_by_file_and_line_the_first_few_then_a_count(tmp_path):
    """A JSONL file with broken lines trains on the rest; the skip report says which file and which lines, the
    first five and then how many more, so they can be fixed (lines count from 1, blank ones included)."""
    lines = [json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1)}) for i in range(3)]
    lines += ['{"problem": "cut off', "", "[1, 2]", "not json", "{", "'single'", "nul\x00", "}", json.dumps({"problem": "x"})]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    loaded = load_problems(DataConfig(name=str(path)))
    assert loaded.skipped == {"unreadable row": 7, "missing answer": 1} and len(loaded.problems) == 3
    assert loaded.where == {"unreadable row": f"{path}, lines 4, 6, 7, 8, 9 and 2 more", "missing answer": f"{path}, line 12"}
    items = tmp_path / "d.json"
    items.write_text(json.dumps([{"problem": "1 + 1?", "answer": "2"}, 7]))
    assert load_problems(DataConfig(name=str(items))).where == {"unreadable row": f"{items}, item 1"}


@pytest.mark.plain
def test_training_reports_the_lines_it_skipped_on_the_console_and_in_data_report(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from thinkrl.cli import app

    rows = [json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(4)]
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join([*rows[:2], "not json", *rows[2:], "{oops"]) + "\n")
    result = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path / "run", 1, "--dataset", str(data)), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["skipped"] == {"unreadable row": 2} and report["skipped_where"] == {"unreadable row": f"{data}, lines 3, 6"}
    line = next(t for t in result.output.splitlines() if t.startswith("data: "))
    assert line.endswith(f"4 prompts, skipped: 2 unreadable row ({data}, lines 3, 6)"), line


@pytest.mark.plain
def test_training_on_a_benchmark_copy_with_another_row_count_warns_and_records_file_and_hash(tmp_path, tiny_model_dir, monkeypatch):
    import hashlib

    from typer.testing import CliRunner

    from thinkrl.cli import app

    copy = tmp_path / "aime24.jsonl"
    copy.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(2)))
    monkeypatch.setenv("THINKRL_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path / "run", 1, "--dataset", "aime24"), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    warned = [t for t in result.output.splitlines() if t.startswith("warning: aime24: ")]
    assert len(warned) == 1 and f"{copy} has 2 rows" in warned[0], result.output
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert (report["source"], report["sha256"]) == (str(copy.resolve()), hashlib.sha256(copy.read_bytes()).hexdigest())


# ---------------------------------------------------------------- byte-order marks


def test_a_byte_order_mark_is_not_part_of_the_data(tmp_path):
    (tmp_path / "d.csv").write_text("problem,answer\n1 + 1?,2\n", encoding="utf-8-sig")  # Excel's "CSV UTF-8"
    assert [(p.problem, p.answer) for p in load_problems(DataConfig(name=str(tmp_path / "d.csv"))).problems] == [("1 + 1?", "2")]
    rows = [{"problem": "1 + 1?", "answer": "2"}, {"problem": "2 + 2?", "answer": "4"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8-sig")
    loaded = load_problems(DataConfig(name=str(tmp_path / "d.jsonl")))
    assert [p.answer for p in loaded.problems] == ["2", "4"] and loaded.skipped == {}  # the first row is not lost
    (tmp_path / "d.json").write_text(json.dumps(rows), encoding="utf-8-sig")
    assert len(load_problems(DataConfig(name=str(tmp_path / "d.json"))).problems) == 2


def test_column_names_are_quoted_so_invisible_characters_show(tmp_path):
    (tmp_path / "d.csv").write_text("\u200bproblem,answer \n1 + 1?,2\n")
    with pytest.raises(UserError, match=r"has no column 'problem' \(columns: '\\u200bproblem', 'answer '\)"):
        load_problems(DataConfig(name=str(tmp_path / "d.csv")))


# ---------------------------------------------------------------- eval: the verifier's timeouts and crashes


def faulty_grade(completion: str, answer: str):
    """Grading of gold 111 runs past any limit, of gold 222 kills its worker (imported by spawned workers)."""
    import time

    if answer == "111":
        time.sleep(60)
    if answer == "222":
        os._exit(1)
    return verifier.grade(completion, answer)


@pytest.mark.plain
def test_eval_records_why_a_sample_scored_zero_and_the_verifier_counts(tiny_model_dir, tmp_path, monkeypatch, capsys):
    real = verifier.VerifierPool
    monkeypatch.setattr(verifier, "VerifierPool", lambda *a, **k: real(workers=1, timeout=1.0, grade_fn=faulty_grade))
    rows = [{"id": "slow", "problem": "1?", "answer": "111"}, {"id": "dies", "problem": "2?", "answer": "222"}]
    rows += [{"id": f"ok{i}", "problem": f"{i}?", "answer": str(i)} for i in range(3)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out"
    code, err = run_cli(eval_args(tiny_model_dir, data, out), capsys)
    assert code == 0, err
    samples = {r["id"]: r for r in read_jsonl(out / "samples.jsonl")}
    assert samples["slow"]["zero_reason"] == "timeout" and samples["dies"]["zero_reason"] == "crash"
    for i in range(3):
        r = samples[f"ok{i}"]
        assert r["zero_reason"] == (
            None if r["correct"] else "wrong" if r["extracted"] is not None else "truncated" if r["truncated"] else "no answer"
        )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verifier"] == {"timeouts": 1, "crashes": 1}
    assert summary["outcomes"]["timeout"] == 1 and summary["outcomes"]["crash"] == 1 and sum(summary["outcomes"].values()) == 5
    assert "grading timed out on 1 samples and crashed its worker on 1" in " ".join(err.split())  # however the path wraps


def test_outcomes_of_rows_written_before_zero_reason():
    rows = [
        {"correct": True, "extracted": "2", "truncated": False},
        {"correct": False, "extracted": "3", "truncated": False},
        {"correct": False, "extracted": None, "truncated": True},
        {"correct": False, "extracted": None, "truncated": False},
        {"correct": False, "extracted": None, "truncated": False, "zero_reason": "timeout"},
    ]
    assert evaluate_mod.outcomes(rows) == {"correct": 1, "wrong": 1, "no answer": 1, "truncated": 1, "timeout": 1, "crash": 0}
