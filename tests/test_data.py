import json

import pytest

from thinkrl.config import ArithConfig, DataConfig, PromptConfig
from thinkrl.data import build_prompts, load_problems, normalise_answer, render_prompt, step_prompts
from thinkrl.data.arith import _arith_value, arith_problems
from thinkrl.errors import UserError
from thinkrl.settings import load_config


def test_arith_is_seeded_correct_and_splits_are_disjoint():
    cfg = ArithConfig(min_value=1, max_value=30, ops="+-*", terms=3, train_size=300, test_size=100, seed=7)
    train, test = arith_problems(cfg, "train"), arith_problems(cfg, "test")
    assert len(train) == 300 and len(test) == 100
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert [p.problem for p in arith_problems(cfg, "train")] == [p.problem for p in train]
    for p in train[:50]:
        expr = p.problem.removeprefix("What is ").removesuffix("?")
        assert int(p.answer) == eval(expr)  # the test may use eval on its own strings


def test_arith_value_precedence():
    assert _arith_value([2, 3, 4], ["+", "*"]) == 14
    assert _arith_value([10, 3, 2], ["-", "*"]) == 4


def test_arith_rejects_too_small_a_range():
    overrides = ["data.arith.min_value=1", "data.arith.max_value=3", "data.arith.train_size=100", "data.arith.test_size=10"]
    with pytest.raises(UserError, match=r"data.arith.min_value..max_value is too small a range for 110"):
        load_config(overrides=overrides)
    with pytest.raises(ValueError, match="too small"):  # a section checks itself however it is built
        ArithConfig(min_value=1, max_value=3, train_size=100, test_size=10)


def test_normalise_answer():
    assert normalise_answer(27.0) == "27"
    assert normalise_answer("27.00") == "27"
    assert normalise_answer(" 5 ") == "5"
    assert normalise_answer("") is None and normalise_answer(None) is None
    assert normalise_answer("\\frac{1}{2}") == "\\frac{1}{2}"


def test_jsonl_with_bad_rows_is_loaded_with_skips_counted(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "no answer"}, {"problem": "x", "answer": ""}, {"problem": "2+2?", "answer": 4}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    loaded = load_problems(DataConfig(name=str(path)))
    assert [(p.problem, p.answer) for p in loaded.problems] == [("1+1?", "2"), ("2+2?", "4")]
    assert loaded.skipped == {"unreadable row": 1, "missing answer": 2}


def test_csv_parquet_and_custom_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.csv").write_text("question,final\nWhat is 2+3?,5\n")
    loaded = load_problems(DataConfig(name=str(tmp_path / "d.csv"), problem_key="question", answer_key="final"))
    assert loaded.problems[0].answer == "5"
    pq.write_table(pa.table({"problem": ["p1", "p2"], "answer": [27.0, 3.5]}), tmp_path / "d.parquet")
    assert [p.answer for p in load_problems(DataConfig(name=str(tmp_path / "d.parquet"))).problems] == ["27", "3.5"]


def test_missing_column_and_missing_file_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "q", "answer": "1"}\n')
    with pytest.raises(UserError, match="no column 'problem'.*set data.problem_key"):
        load_problems(DataConfig(name=str(path)))
    with pytest.raises(UserError, match="dataset file not found"):
        load_problems(DataConfig(name=str(tmp_path / "nope.jsonl")))


def test_hub_failure_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match="could not load dataset 'someone/not-a-dataset'.*local"):
        load_problems(DataConfig(name="someone/not-a-dataset"))


def test_prompts_chat_and_plain(tiny_model_dir, tiny_plain_model_dir):
    from transformers import AutoTokenizer

    chat_tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text, chat = render_prompt("What is 1 + 2?", chat_tok, PromptConfig(system="Be brief.", instruction="{problem} Box it: \\boxed{}"))
    assert chat and text == "<|system|>Be brief.\n<|user|>What is 1 + 2? Box it: \\boxed{}\n<|assistant|>"
    plain_tok = AutoTokenizer.from_pretrained(tiny_plain_model_dir)
    text, chat = render_prompt("What is 1 + 2?", plain_tok, PromptConfig(instruction="{problem}"))
    assert not chat and text == "Question: What is 1 + 2?\nAnswer:"
    with pytest.raises(UserError, match="no chat template"):
        render_prompt("x", plain_tok, PromptConfig(template="chat"))


def test_too_long_prompts_are_dropped_and_counted(tiny_model_dir):
    from transformers import AutoTokenizer

    from thinkrl.data import Problem

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    problems = [Problem("a", "short", "1"), Problem("b", "long " * 50, "1")]
    prompts, dropped = build_prompts(problems, tok, PromptConfig(instruction="{problem}"), max_tokens=40)
    assert [p.id for p in prompts] == ["a"] and dropped == 1
    assert tok.decode(prompts[0].ids) == prompts[0].text


def test_step_prompts_are_a_function_of_seed_and_step():
    from thinkrl.data import Prompt

    prompts = [Prompt(str(i), "", "", "", []) for i in range(10)]
    epoch0 = [p.id for s in range(5) for p in step_prompts(prompts, s, 2, seed=3)]
    assert sorted(epoch0) == [str(i) for i in range(10)]  # each prompt once per epoch
    assert [p.id for p in step_prompts(prompts, 2, 2, seed=3)] == epoch0[4:6]
    assert [p.id for s in range(5, 10) for p in step_prompts(prompts, s, 2, seed=3)] != epoch0  # reshuffled
