"""Bad input through the CLI: exit status 2 and one line `error: ...` that names the file, row or key and
says what to do, never a traceback. (Unknown methods and unknown -o keys: tests/test_cli_e2e.py.)

The CLI runs in-process through `thinkrl.cli.run`, the console-script entry point: that is where a
UserError becomes the error line and exit status 2 (typer's CliRunner on `app` sees the UserError itself,
which the other CLI tests rely on)."""

import json
import shutil
import sys

import pytest

from thinkrl.cli import run
from thinkrl.errors import UserError

OVERRIDES = [
    "train.steps=1", "rollout.max_new_tokens=4", "rollout.group_size=2", "rollout.prompts_per_step=1", "verifier.workers=1",
    "data.arith.train_size=100", "data.arith.test_size=20", "data.arith.min_value=1", "data.arith.max_value=40",
]  # fmt: skip
FAST = [arg for o in OVERRIDES for arg in ("-o", o)]


@pytest.fixture
def error_line(monkeypatch, capsys):
    """Run the CLI with `args` and return its one error line. Any exception other than the exit (a
    traceback for the user) fails the test with that traceback."""

    def run_cli(args: list[str]) -> str:
        monkeypatch.setattr(sys, "argv", ["thinkrl", *args])
        with pytest.raises(SystemExit) as exit_:
            run()
        out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert exit_.value.code == 2, out + err
        assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err  # the last thing printed, one line
        assert "Traceback" not in out + err
        return errors[0]

    return run_cli


def train(tmp_path, model, *extra) -> list[str]:
    return ["train", "--model", str(model), "--output-dir", str(tmp_path / "run"), *FAST, *extra]


def write(path, text: str):
    path.write_text(text)
    return path


# ------------------------------------------------------------------ config files


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train:\n  lr: [1,\n", ["c.yaml:3: malformed YAML"]),
        ("train:\n  lrr: 1e-4\n", ["unknown config key 'train.lrr'", "did you mean train.lr?"]),
        ("train:\n  steps: many\n", ["train.steps: expected int, got 'many'"]),
        ("rollout: 8\n", ["rollout: expected a mapping of its keys, got 8"]),
        ("- train\n- lr\n", ["c.yaml: expected a mapping of config sections at the top level"]),
        ("model:\n  dtype: fp64\n", ["model.dtype: 'fp64' is not one of"]),
    ],
    ids=["malformed", "unknown-key", "ill-typed", "section-not-a-mapping", "top-level-list", "bad-choice"],
)
def test_bad_config_file(tmp_path, tiny_model_dir, text, expected, error_line):
    line = error_line(train(tmp_path, tiny_model_dir, str(write(tmp_path / "c.yaml", text))))
    assert all(e in line for e in expected), line


def test_missing_config_file(tmp_path, tiny_model_dir, error_line):
    line = error_line(train(tmp_path, tiny_model_dir, str(tmp_path / "nope.yaml")))
    assert line == f"error: config file not found: {tmp_path / 'nope.yaml'}"


# ------------------------------------------------------------------ datasets


def test_missing_dataset_file(tmp_path, tiny_model_dir, error_line):
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(tmp_path / "nope.jsonl")))
    assert f"dataset file not found: {tmp_path / 'nope.jsonl'}" in line


def test_dataset_path_is_a_directory(tmp_path, tiny_model_dir, error_line):
    (tmp_path / "data").mkdir()
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(tmp_path / "data")))
    assert "is a directory; pass one .jsonl" in line


@pytest.mark.parametrize("text", ["", "\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_dataset_file(tmp_path, tiny_model_dir, text, error_line):
    path = write(tmp_path / "d.jsonl", text)
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(path)))
    assert f"dataset {path} has no rows" in line and '{"problem": ' in line  # says what a row looks like


def test_dataset_without_the_answer_column(tmp_path, tiny_model_dir, error_line):
    path = write(tmp_path / "d.jsonl", json.dumps({"problem": "What is 1 + 1?", "solution": "2"}) + "\n")
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(path)))
    assert f"dataset {path} has no column 'answer' (columns: 'problem', 'solution'); set data.answer_key" in line


def test_csv_without_the_problem_column(tmp_path, tiny_model_dir, error_line):
    path = write(tmp_path / "d.csv", "question,answer\nWhat is 1 + 1?,2\n")
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(path)))
    assert "has no column 'problem' (columns: 'question', 'answer'); set data.problem_key" in line


def test_every_prompt_longer_than_max_prompt_tokens(tmp_path, tiny_model_dir, error_line):
    path = write(tmp_path / "d.jsonl", "".join(json.dumps({"problem": "x" * 200, "answer": "1"}) + "\n" for _ in range(3)))
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(path), "-o", "data.max_prompt_tokens=32"))
    assert f"every prompt of {path} is longer than data.max_prompt_tokens=32" in line


@pytest.mark.parametrize("budget", ["1000000000", "512"])
def test_a_completion_budget_past_the_models_context(tmp_path, tiny_model_dir, error_line, monkeypatch, budget):
    """No prompt fits beside a budget of the whole 512-token context or more: refused before the model loads,
    naming the numbers and a budget that fits."""
    monkeypatch.setattr("thinkrl.setup.load_policy", lambda *a: pytest.fail("the model loaded"))
    line = error_line(train(tmp_path, tiny_model_dir, "-o", f"rollout.max_new_tokens={budget}"))
    assert f"rollout.max_new_tokens={budget} leaves no room for a prompt in the 512-token context of model {tiny_model_dir}" in line
    assert "set it below 512 (-o rollout.max_new_tokens=256 leaves 256 tokens for the prompt)" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("d.jsonl", b"this is not json\nnor this\n", ["d.jsonl, line 1:", "no line of the file is a JSON object", '{"problem": ']),
        ("d.jsonl", b"[1, 2]\n", ["d.jsonl, line 1: a JSON list, not an object"]),
        ("d.json", b'[{"problem": "p", "answer": "1"},\n oops]', ["d.json, line 2 column 2: malformed JSON"]),
        ("d.jsonl", b'{"problem": "caf\xe9", "answer": "1"}\n', ["d.jsonl: not UTF-8 text", "re-save the file as UTF-8"]),
        ("d.parquet", b"PAR1 but not really parquet", ["d.parquet: could not read it as parquet"]),
        ("d.txt", b"problem answer\n", ["d.txt: unsupported file type '.txt'; use .jsonl, .json, .parquet or .csv"]),
    ],
    ids=["not-json-lines", "json-but-not-objects", "malformed-json", "not-utf8", "corrupt-parquet", "unsupported-type"],
)
def test_unreadable_dataset_file(tmp_path, tiny_model_dir, name, content, expected, error_line):
    (tmp_path / name).write_bytes(content)
    line = error_line(train(tmp_path, tiny_model_dir, "--dataset", str(tmp_path / name)))
    assert all(e in line for e in expected), line


# ------------------------------------------------------------------ models


def test_model_directory_without_a_tokenizer(tmp_path, tiny_model_dir, error_line):
    model = tmp_path / "no-tokenizer"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        if not f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, model / f.name)
    line = error_line(train(tmp_path, model))
    assert f"model directory {model} has no tokenizer" in line and ".save_pretrained(" in line


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda d: (d / "model.safetensors").unlink(), "no file named model.safetensors"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\0" * 100), "SafetensorError"),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json' is not a valid JSON file"),
        (lambda d: (d / "config.json").unlink(), "has no config.json"),
    ],
    ids=["no-weights", "corrupt-weights", "corrupt-config", "no-config"],
)
def test_broken_model_directory(tmp_path, tiny_model_dir, damage, expected, error_line):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    damage(model)
    line = error_line(train(tmp_path, model))
    assert str(model) in line and expected in line, line


def test_nonexistent_model_path(tmp_path, error_line):
    line = error_line(train(tmp_path, tmp_path / "nosuch-model"))
    assert f"model path {tmp_path / 'nosuch-model'} does not exist; model.name (--model) takes a local checkpoint directory" in line


def test_model_path_is_a_file(tmp_path, error_line):
    line = error_line(train(tmp_path, write(tmp_path / "model.bin", "x")))
    assert "is a file; model.name (--model) takes" in line


@pytest.mark.parametrize(
    "targets, expected",
    [("nosuch_proj", "Target modules {'nosuch_proj'} not found in the base model"), ("norm", "Target module LlamaRMSNorm")],
    ids=["matches-nothing", "not-a-linear-layer"],
)
def test_lora_target_modules_that_cannot_be_adapted(tmp_path, tiny_model_dir, targets, expected, error_line):
    line = error_line(train(tmp_path, tiny_model_dir, "-o", f"model.lora.target_modules={targets}"))
    assert line.startswith(f"error: model.lora.target_modules={targets}: {expected}")
    assert "set it to some of this model's linear layers (down_proj, gate_proj, k_proj" in line and "or to all-linear" in line


# ------------------------------------------------------------------ plugins


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import os\n\nraise RuntimeError('boom at import')\n", "failed to import: RuntimeError: boom at import (line 3)"),
        ("def loss(batch:\n    return 0\n", "failed to import: SyntaxError: '(' was never closed (line 1)"),
        ("import not_a_module_anywhere\n", "failed to import: ModuleNotFoundError: No module named 'not_a_module_anywhere' (line 1)"),
        ("import sys\nsys.exit(3)\n", "failed to import: SystemExit: 3 (line 2)"),
    ],
    ids=["raises", "syntax-error", "missing-import", "sys-exit"],
)
@pytest.mark.parametrize("command", ["train", "methods"])
def test_plugin_that_fails_to_import(tmp_path, tiny_model_dir, source, expected, command, error_line):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    write(plugins / "my_method.py", source)
    args = train(tmp_path, tiny_model_dir) if command == "train" else ["methods"]
    line = error_line([*args, "--plugins", str(plugins)])
    assert line.startswith(f"error: plugin {plugins / 'my_method.py'} {expected}; fix it, or move it out of {plugins}"), line


def test_plugins_option_that_is_not_a_directory(tmp_path, error_line):
    line = error_line(["methods", "--plugins", str(tmp_path / "nope")])
    assert line == f"error: --plugins {tmp_path / 'nope'}: not a directory"


# ------------------------------------------------------------------ the option parser and the engine


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train", "--no-such-option"], "error: No such option: --no-such-option"),
        (["eval", "--n", "many"], "error: Invalid value for '--n': "),
        (["eval", "--engine", "bogus"], "error: Invalid value for '--engine': "),
        (["eval", "--n"], "error: Option '--n' requires an argument."),
        (["plot"], "error: Missing argument 'runs'."),
        (["no-such-command"], "error: No such command 'no-such-command'."),
        (["--no-such-global", "methods"], "error: No such option: --no-such-global"),
    ],
    ids=["unknown-option", "bad-type", "bad-choice", "missing-value", "missing-argument", "unknown-command", "unknown-global"],
)
def test_an_option_parser_error_is_one_line_not_a_panel(args, expected, error_line, capsys):
    line = error_line(args)  # exit 2, one error line, the last thing printed
    assert line.startswith(expected), line
    if args[0] == "eval" and "--engine" in args:
        assert "'bogus' is not one of 'auto', 'lean', 'transformers', 'vllm'" in line, line


def test_a_missing_vllm_is_named_before_the_model_loads(tmp_path, tiny_model_dir, error_line, monkeypatch):
    monkeypatch.setattr("thinkrl.rollout.engines._vllm_installed", lambda: False)  # as in the main venv, wherever this runs
    monkeypatch.setattr("thinkrl.setup.load_tokenizer", lambda *a: pytest.fail("the model loaded"))
    monkeypatch.setattr("thinkrl.evaluation.evaluate.load_for_eval", lambda *a: pytest.fail("the model loaded"))
    line = error_line(train(tmp_path, tiny_model_dir, "-o", "rollout.engine=vllm"))
    assert line.startswith("error: rollout.engine=vllm needs vLLM, which is not installed here: pip install 'thinkrl[vllm]'"), line
    assert line.endswith("or use rollout.engine=lean or rollout.engine=transformers"), line
    line = error_line(["eval", "--model", str(tiny_model_dir), "--engine", "vllm", "--output", str(tmp_path / "eval")])
    assert line.startswith("error: --engine vllm needs vLLM, which is not installed here: pip install 'thinkrl[vllm]'"), line
    assert line.endswith("or use --engine lean or --engine transformers"), line
    monkeypatch.setattr("thinkrl.probe.session.load_tokenizer", lambda *a: pytest.fail("the model loaded"))
    line = error_line(["probe", "--model", str(tiny_model_dir), "-o", "rollout.engine=vllm", "--output", str(tmp_path / "probe")])
    assert line.startswith("error: rollout.engine=vllm needs vLLM, which is not installed here"), line


def test_an_engine_name_from_the_python_api_is_checked_before_the_model_loads(tmp_path, monkeypatch):
    from thinkrl.evaluation.evaluate import evaluate
    from thinkrl.evaluation.settings import EvalSettings

    monkeypatch.setattr("thinkrl.evaluation.evaluate.load_for_eval", lambda *a: pytest.fail("the model loaded"))
    with pytest.raises(UserError, match=r"^--engine bogus: not an engine; choose one of auto, lean, transformers, vllm"):
        evaluate(EvalSettings(model="m", dataset="arith", engine="bogus", limit=1), [], tmp_path / "out")


def test_a_config_named_twice_is_refused(tmp_path, error_line):
    a, b = write(tmp_path / "a.yaml", "train: {steps: 1}\n"), write(tmp_path / "b.yaml", "train: {steps: 2}\n")
    for command in ("train", "config"):
        line = error_line([command, str(a), "--config", str(b)])
        assert line == f"error: {a} and --config {b}: name one config file (CONFIG or --config CONFIG)", line
