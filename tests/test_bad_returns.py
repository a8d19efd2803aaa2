"""Bad return values at run time (issue 19): a grader of the wrong shape, one that raises on some or every text,
and plugin methods that break the loss contract each end in one line naming the grader or the method, never
in a traceback or a run that learns nothing; a real out-of-memory still reads as one. Bad config values:
tests/test_bad_values.py.
"""

import textwrap

import helpers
import pytest
import torch
from test_cli_e2e import tiny_args
from test_faults import error_line, run_cli

import thinkrl.train as train_mod
from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.learner import method_calls
from thinkrl.methods import get_method, load_plugins
from thinkrl.run.jsonl import read_jsonl
from thinkrl.verifier import VerifierPool

# --- 4. what a grader returns


@pytest.fixture(scope="module")
def shaped_pool():
    with VerifierPool(workers=1, timeout=20, grade_fn=helpers.shaped_grade) as pool:
        yield pool


@pytest.mark.parametrize(
    "text, message",
    [
        ("string", "returned '1.0' (str), not (score, extracted answer or None)"),
        ("none", "returned None (NoneType), not (score, extracted answer or None)"),
        ("triple", "returned (1.0, None, 3) (tuple), not (score, extracted answer or None)"),
        ("two", "returned the score 2.0 (float), not a number in [0, 1]"),
        ("nan", "returned the score nan (float), not a number in [0, 1]"),
    ],
)
def test_a_grader_of_the_wrong_shape_is_one_line_naming_it(shaped_pool, text, message):
    with pytest.raises(UserError) as e:
        shaped_pool.grade(["fine", text], ["1", "1"])
    assert str(e.value) == (f"verifier.grader helpers:shaped_grade {message}; a grader returns (score in [0, 1], extracted answer or None)")


def test_a_bare_score_and_a_non_string_answer_are_taken(shaped_pool):
    """As thinkrl/rewards.py takes a grader's pair for its number, a grader's bare number is (score, None)."""
    scores, extracted, stats = shaped_pool.grade(["bare", "sympy", "fine"], ["1", "1", "1"])
    assert scores == [1.0, 1.0, 1.0] and extracted == [None, "42", "fine"] and stats["errors"] == 0


def test_an_exception_on_some_texts_scores_zero_and_is_counted(shaped_pool):
    scores, extracted, stats = shaped_pool.grade(["raise", "fine", "raise"], ["1", "1", "1"])
    assert scores == [0.0, 1.0, 0.0] and extracted == [None, "fine", None]
    assert stats == {"timeouts": 0, "crashes": 0, "errors": 2}
    assert shaped_pool.grade(["raise"], ["1"])[2]["errors"] == 1  # one text alone says nothing about the grader


def test_an_exception_on_every_text_is_the_graders_fault(shaped_pool):
    with pytest.raises(UserError) as e:
        shaped_pool.grade(["raise", "raise", "raise"], ["1", "2", "3"])
    assert str(e.value).startswith(
        "verifier.grader helpers:shaped_grade raised on every one of the 3 completions graded together "
        "(the first: ZeroDivisionError: division by zero), so the grader is broken, not the text"
    ), str(e.value)
    assert shaped_pool.grade(["fine"], ["1"])[0] == [1.0]  # the pool keeps working


@pytest.mark.plain
def test_a_run_whose_grader_always_raises_stops_with_one_line(tiny_model_dir, tmp_path, capsys):
    """Before: exit 0, reward 0 on every step and verifier/crashes 0."""
    out = tmp_path / "run"
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "-o", "verifier.grader=helpers:always_raising_grade"), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith("error: verifier.grader helpers:always_raising_grade raised on every one of the 8"), line
    assert "KeyError: 'answer_key'" in line, line
    assert not (out / "metrics.jsonl").exists() or read_jsonl(out / "metrics.jsonl") == []


@pytest.mark.plain
def test_a_run_counts_grader_exceptions_as_verifier_errors(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "-o", "verifier.grader=helpers:odd_length_raising_grade"), capsys)
    assert code == 0, err
    metrics = read_jsonl(out / "metrics.jsonl")
    assert sum(m["verifier/errors"] for m in metrics) > 0 and all(m["verifier/crashes"] == 0 for m in metrics), metrics


@pytest.mark.plain
def test_a_run_whose_grader_returns_a_string_stops_naming_it(tiny_model_dir, tmp_path, capsys):
    code, err = run_cli(tiny_args(tiny_model_dir, tmp_path / "run", 1, "-o", "verifier.grader=helpers:string_grade"), capsys)
    line = error_line(err)
    assert code == 2 and line == (
        "error: verifier.grader helpers:string_grade returned 'correct' (str), not (score, extracted answer or None); "
        "a grader returns (score in [0, 1], extracted answer or None)"
    ), line


# --- 5. plugin methods at run time

PLUGINS = """
from dataclasses import dataclass

import torch

from thinkrl.methods import Method, register
from thinkrl.methods._common import Reduction, reduce


@dataclass
class Config(Reduction):
    pass  # aggregation and norm_length only


class Base(Method):
    Config = Config

    def good(self, batch):
        return reduce(-batch.advantages * batch.logp, batch, self.cfg)


@register("bv_nograd")
class NoGrad(Base):
    def loss(self, batch):
        return self.good(batch).detach(), {}


@register("bv_vector")
class Vector(Base):
    def loss(self, batch):
        return -(batch.advantages * batch.logp).sum(-1), {}


@register("bv_raises")
class Raises(Base):
    def loss(self, batch):
        return self.good(batch), {"x": batch.logp[:, 99]}


@register("bv_oom_text")
class OomText(Base):
    def loss(self, batch):
        raise RuntimeError("CUDA out of memory in my own bookkeeping")


@register("bv_float_metric")
class FloatMetric(Base):
    def loss(self, batch):
        return self.good(batch), {"frac": 0.5}


@register("bv_vector_metric")
class VectorMetric(Base):
    def loss(self, batch):
        return self.good(batch), {"per_seq": batch.logp.detach().mean(-1)}


@register("bv_pair")
class NotAPair(Base):
    def loss(self, batch):
        return self.good(batch)


@register("bv_fine")
class Fine(Base):
    def loss(self, batch):
        return self.good(batch), {"logp/mean": batch.logp.detach().mean()}


@register("bv_real_oom")
class RealOom(Base):
    def loss(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bad_plugins")
    (directory / "bad_methods.py").write_text(textwrap.dedent(PLUGINS))
    load_plugins(directory)
    return directory


def _batch() -> TokenBatch:
    logp = torch.log(torch.full((2, 3), 0.5)).requires_grad_()
    mask = torch.ones(2, 3, dtype=torch.bool)
    return TokenBatch(logp=logp, old_logp=logp.detach(), behav_logp=logp.detach(), advantages=torch.tensor([1.0, -1.0]), mask=mask)


@pytest.mark.parametrize(
    "name, message",
    [
        ("bv_nograd", "loss() returned a loss that does not require grad, so no update could follow it"),
        ("bv_vector", "loss() returned a loss of shape (2,), not a scalar; reduce it to one number"),
        ("bv_raises", "loss() raised IndexError: index 99 is out of bounds for dimension 1 with size 3 (line 37)"),
        ("bv_oom_text", "loss() raised RuntimeError: CUDA out of memory in my own bookkeeping (line 43)"),
        ("bv_float_metric", "loss() metric 'frac' is 0.5 (float), not a one-element tensor"),
        ("bv_vector_metric", "loss() metric 'per_seq' is shape (2,), not a one-element tensor"),
        ("bv_pair", "loss() returned tensor("),
    ],
)
def test_a_plugin_loss_that_breaks_the_contract_is_one_line(plugin_dir, name, message):
    with pytest.raises(UserError) as e:
        method_calls.loss(get_method(name), _batch())
    text = str(e.value)
    assert text.startswith(f"method {name} ({plugin_dir / 'bad_methods.py'}): {message}"), text
    assert "\n" not in text and len(text) < 400, text


def test_a_good_plugin_and_a_real_out_of_memory_pass_through(plugin_dir):
    loss, metrics = method_calls.loss(get_method("bv_fine"), _batch())
    assert loss.requires_grad and set(metrics) == {"logp/mean"}
    with pytest.raises(torch.OutOfMemoryError):
        method_calls.loss(get_method("bv_real_oom"), _batch())


def test_a_built_in_method_keeps_its_traceback(monkeypatch):
    """An exception inside thinkrl's own methods is a thinkrl bug: not dressed up as the user's error."""
    method = get_method("grpo")
    monkeypatch.setattr(method, "loss", lambda batch: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        method_calls.loss(method, _batch())


@pytest.mark.parametrize(
    "name, message",
    [
        ("bv_nograd", "loss() returned a loss that does not require grad"),
        ("bv_oom_text", "loss() raised RuntimeError: CUDA out of memory in my own bookkeeping (line 43)"),
    ],
)
@pytest.mark.plain
def test_a_broken_plugin_in_a_run_is_one_line_not_a_traceback_or_an_oom(plugin_dir, tiny_model_dir, tmp_path, capsys, name, message):
    args = tiny_args(tiny_model_dir, tmp_path / "run", 1, "--plugins", plugin_dir, "--method", name)
    code, err = run_cli(args, capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: method {name} ({plugin_dir / 'bad_methods.py'}): {message}"), line
    assert "out of GPU memory" not in line


def test_a_runtime_error_that_only_says_out_of_memory_is_not_reported_as_one(tiny_model_dir, tmp_path, capsys, monkeypatch):
    def collect(*args, **kwargs):
        raise RuntimeError("my tokenizer ran out of memory budget")

    monkeypatch.setattr(train_mod, "collect", collect)
    with pytest.raises(RuntimeError, match="my tokenizer ran out of memory budget"):
        run_cli(tiny_args(tiny_model_dir, tmp_path / "run", 1), capsys)
