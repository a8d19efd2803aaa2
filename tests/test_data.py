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


def no_hub_env(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "THINKRL_DATA_DIR"):
        monkeypatch.delenv(key, raising=False)


def test_an_unreachable_hub_is_asked_once_and_the_error_names_the_offline_ways(monkeypatch):
    import datasets
    import huggingface_hub

    no_hub_env(monkeypatch)
    asked = []

    def unreachable(self, repo_id, **kwargs):
        asked.append(repo_id)
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", unreachable)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("went on to datasets, which retries for half a minute"))
    with pytest.raises(UserError) as e:
        load_problems(DataConfig(name="gsm8k"), flag="--dataset")
    line = str(e.value)
    assert asked == ["openai/gsm8k"] and "\n" not in line
    assert "unreachable" in line and "--dataset FILE" in line and "THINKRL_DATA_DIR" in line and "gsm8k.jsonl" in line
    assert "data.name" not in line  # eval's users pass --dataset, not a training key
    with pytest.raises(UserError, match=r"pass data.name=FILE .* THINKRL_DATA_DIR holds copies of the aliases only"):
        load_problems(DataConfig(name="someone/a-dataset"))  # training's words; not an alias
    assert asked == ["openai/gsm8k", "someone/a-dataset"]


def test_hf_hub_offline_means_no_request_to_the_hub(monkeypatch):
    import datasets
    import huggingface_hub

    no_hub_env(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda *a, **k: pytest.fail("asked the hub with HF_HUB_OFFLINE=1"))

    def cache_only(path, *args, **kwargs):  # what datasets does offline with nothing cached
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", cache_only)
    with pytest.raises(UserError, match=r"HF_HUB_OFFLINE is set, so the hub was not tried.*--dataset FILE.*THINKRL_DATA_DIR"):
        load_problems(DataConfig(name="math"), flag="--dataset")


def test_shipped_benchmarks_load_offline_with_their_known_rows_and_recorded_hashes(monkeypatch):
    """aime24, aime25, amc23 and math500 come from the package: no hub, no THINKRL_DATA_DIR, no warning; the
    README beside them lists the sha256 an evaluation records."""
    import hashlib

    from thinkrl.data import sources
    from thinkrl.data.benchmarks import HERE, KNOWN_ROWS

    no_hub_env(monkeypatch)
    monkeypatch.setattr(sources, "read_hub", lambda *a, **k: pytest.fail("asked the hub for a shipped set"))
    readme = (HERE / "README.md").read_text()
    for name, rows in KNOWN_ROWS.items():
        loaded = load_problems(DataConfig(name=name))
        digest = hashlib.sha256((HERE / f"{name}.jsonl").read_bytes()).hexdigest()
        assert len(loaded.problems) == len({p.id for p in loaded.problems}) == rows, name
        assert (loaded.origin, loaded.sha256, loaded.skipped, loaded.warnings) == (f"package:{name}", digest, {}, []), name
        assert f"{digest}  {name}.jsonl" in readme, name
    answers = {p.id: p.answer for name in ("aime24", "aime25", "amc23") for p in load_problems(DataConfig(name=name)).problems}
    assert (answers["aime24-I-1"], answers["aime24-II-1"], answers["aime25-I-1"], answers["amc23-12A-1"]) == ("204", "73", "70", "27")


def test_the_wheel_carries_the_shipped_benchmarks():
    tomllib = pytest.importorskip("tomllib")
    from fnmatch import fnmatch

    from thinkrl.data.benchmarks import HERE, KNOWN_ROWS

    pyproject = tomllib.loads((HERE.parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["thinkrl.data.benchmarks"]
    for file in [*(f"{name}.jsonl" for name in KNOWN_ROWS), "README.md"]:
        assert any(fnmatch(file, g) for g in globs), file


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


def test_the_plain_fallback_of_template_auto_is_noted_once_with_how_to_choose(tiny_model_dir, tiny_plain_model_dir):
    from transformers import AutoTokenizer

    from thinkrl.data import template_note, uses_chat

    chat_tok, plain_tok = AutoTokenizer.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_plain_model_dir)
    note = template_note(plain_tok, PromptConfig())
    assert note and "no chat template" in note and "'Question: ... Answer:'" in note
    assert "prompt.template=plain" in note and "prompt.template=chat" in note
    assert template_note(chat_tok, PromptConfig()) is None and template_note(plain_tok, PromptConfig(template="plain")) is None
    assert uses_chat(chat_tok, PromptConfig()) and not uses_chat(plain_tok, PromptConfig())
    assert not uses_chat(chat_tok, PromptConfig(template="plain"))


def test_the_context_is_the_models_and_a_prompt_must_leave_the_room_asked_for():
    """One rule for training (room: its whole budget) and eval (room 1: it clips each prompt's budget)."""
    from types import SimpleNamespace

    from thinkrl.data import Prompt, fit_context, model_context

    assert model_context(SimpleNamespace(max_position_embeddings=512), SimpleNamespace(model_max_length=2048)) == 512
    assert model_context(SimpleNamespace(), SimpleNamespace(model_max_length=2048)) == 2048  # no config value: the tokenizer's
    assert model_context(None, SimpleNamespace(model_max_length=int(1e30))) is None  # transformers' "not set"
    prompts = [Prompt(str(n), "", "", "", [0] * n) for n in (10, 40, 41, 50)]
    kept, skipped = fit_context(prompts, 50, room=10)
    assert [p.id for p in kept] == ["10", "40"] and skipped == 2
    assert [p.id for p in fit_context(prompts, 50, room=1)[0]] == ["10", "40", "41"]  # 50 tokens fill it
    assert fit_context(prompts, None, room=10) == (prompts, 0)  # a context nobody states: nothing is skipped


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
