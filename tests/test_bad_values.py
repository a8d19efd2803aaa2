"""Bad values that pass type checks (issue 19): each one ends in one line naming the key, the value and the valid
range (exit 2), never in a traceback, a run that learns nothing, or a multi-megabyte message.

1. config values: ranges and finite numbers for every field (a walk over every float field of every section and
   every method's Config), huge numbers, the YAML alias bomb; 2. `thinkrl eval` values; 3. message length caps.
What graders and plugin methods return: tests/test_bad_returns.py.
"""

import dataclasses
import math
import time
import typing

import pytest
from test_cli_e2e import tiny_args
from test_faults import error_line, run_cli

from thinkrl.config import Config
from thinkrl.config.load import all_keys
from thinkrl.config.typecheck import hints
from thinkrl.errors import MAX_MESSAGE_CHARS, UserError, capped, short
from thinkrl.evaluation.settings import EvalSettings, resolve_settings
from thinkrl.methods import available_methods, get_method, method_class
from thinkrl.settings import load_config, resolve


def refused(*overrides: str) -> str:
    """The one-line UserError the overrides give when loaded and resolved."""
    with pytest.raises(UserError) as e:
        resolve(load_config(overrides=list(overrides)))
    message = str(e.value)
    assert "\n" not in message and len(message) < 600, message
    return message


# --- 1. config values


@pytest.mark.parametrize(
    "override, message",
    [
        ("verifier.timeout=.inf", r"verifier.timeout must be in \(0, 86400\] seconds \(a day\), got inf"),
        ("verifier.timeout=1e300", r"verifier.timeout must be in \(0, 86400\] seconds \(a day\), got 1e\+300"),
        ("rollout.temperature=.inf", r"rollout.temperature must be > 0 for training \(sampling\) and finite, got inf"),
        ("rollout.top_p=.nan", r"rollout.top_p must be in \(0, 1\], got nan"),
        ("model.lora.alpha=.nan", r"model.lora.alpha must be > 0 and finite .*, got nan"),
        ("model.lora.alpha=.inf", r"model.lora.alpha must be > 0 and finite .*, got inf"),
        ("model.lora.dropout=1", r"model.lora.dropout must be in \[0, 1\), got 1"),
        ("model.lora={dropout: 5}", r"model.lora.dropout must be in \[0, 1\), got 5"),
        ("train.lr=.inf", r"train.lr must be > 0 and finite, got inf"),
        ("train.weight_decay=-0.1", r"train.weight_decay must be >= 0 and finite, got -0.1"),
        ("train.weight_decay=.inf", r"train.weight_decay must be >= 0 and finite, got inf"),
        ("train.adam_betas=[0.9, 1.0]", r"train.adam_betas must each be in \[0, 1\), got \[0.9, 1.0\]"),
        ("train.adam_betas=[.nan, 0.9]", r"train.adam_betas must each be in \[0, 1\), got \[nan, 0.9\]"),
        ("train.grad_clip=.inf", r"train.grad_clip must be >= 0 and finite \(0 = off\), got inf"),
        ("correction.c_max=.inf", r"correction.c_min and c_max need 0 <= c_min < c_max, both finite, got 0.0 and inf"),
        ("advantage.eps=.nan", r"advantage.eps must be >= 0 and finite, got nan"),
        ("reward.overlong_buffer=.inf", r"reward.overlong_buffer must be >= 0 and finite \(0 = off\), got inf"),
        ("reward.overlong_penalty=.nan", r"reward.overlong_penalty must be >= 0 and finite, got nan"),
        ("reward.max_failure_share=0", r"reward.max_failure_share must be in \(0, 1\] \(1: stop only when every call fails\), got 0"),
        ("reward.max_failure_share=1.5", r"reward.max_failure_share must be in \(0, 1\] .*, got 1.5"),
        ("rollout.vllm.memory=.nan", r"rollout.vllm.memory must be in \[0, 1\)"),
        ("seeds.frac_max=.inf", r"seeds.frac_min and frac_max need 0 < frac_min <= frac_max <= 1"),
        ("log.rollouts_every=-1", r"log.rollouts_every must be >= 0 \(0 = never\), got -1"),
        ("eval.n=1000000", r"eval.n must be in \[1, 100000\] \(one problem's n completions .*\), got 1000000"),
        ("method.clip_high=.inf", r"method.clip_high: inf is not a finite number; give a finite value \(Upper clip"),
        ("method.beta=-.inf", r"method: beta must be >= 0"),
        ("train.lr=1" + "0" * 400, r"train.lr: 1000.*000 is too large for a number \(the largest is about 1.8e308\)"),
        ("train.steps=" + "9" * 5000, r"train.steps: expected int, got '999.*999' \(str\)"),
        ("train.gradient_checkpointing=maybe", r"train.gradient_checkpointing: 'maybe' is not a valid bool or 'auto'"),
    ],
)
def test_a_bad_value_is_one_line_naming_key_value_and_range(override, message):
    with pytest.raises(UserError, match=message):
        resolve(load_config(overrides=[override]))
    refused(override)  # one line, short


@pytest.mark.parametrize(
    "overrides, estimator",
    [((), "grpo"), (("method.name=dr_grpo",), "no_std"), (("advantage.estimator=rloo",), "rloo")],
)
def test_a_group_of_one_is_refused_for_group_relative_advantages(overrides, estimator):
    """Before: rollout.group_size=1 trained grpo and no_std on the raw reward, with no baseline, without a word."""
    assert refused("rollout.group_size=1", *overrides) == (
        f"rollout.group_size=1: advantage.estimator={estimator} compares each completion with the others of its prompt's "
        "group, and a group of one has none to compare with; set rollout.group_size to 2 or more"
    )


def test_a_run_with_a_group_of_one_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run_cli(tiny_args(tiny_model_dir, out, 1, "-o", "rollout.group_size=1"), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith("error: rollout.group_size=1: advantage.estimator=grpo compares"), line
    assert "model:" not in err and not out.exists()


def _float_keys() -> list[tuple[str, bool]]:
    """Every float setting of the run config: (dotted key, holds a list of floats)."""
    out = []
    for key in all_keys():
        section: typing.Any = Config
        *path, name = key.split(".")
        for part in path:
            section = hints(section)[part]
        tp = hints(section)[name]
        if tp is float or tp == (float | None):
            out.append((key, False))
        elif tp == list[float]:
            out.append((key, True))
    return out


FLOAT_KEYS = _float_keys()


def test_the_walk_finds_the_float_settings():
    keys = {k for k, _ in FLOAT_KEYS}
    assert {"train.lr", "rollout.temperature", "verifier.timeout", "model.lora.alpha", "train.adam_betas"} <= keys, keys
    assert len(keys) >= 15


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key, is_list", FLOAT_KEYS, ids=[k for k, _ in FLOAT_KEYS])
def test_no_float_setting_takes_nan_or_infinity(key, is_list, value):
    """A range check alone lets inf (or, written as `not x < 0`, NaN) through; every float setting refuses both."""
    text = f"[{value}, 0.5]" if is_list else value
    message = refused(f"{key}={text}")
    assert message.startswith(key) or message.startswith(key.rsplit(".", 1)[0]), message
    assert ("nan" if value == ".nan" else "inf") in message, message


def _method_float_fields() -> list[tuple[str, str]]:
    out = []
    for name in available_methods():
        cls = method_class(name).Config
        for f in dataclasses.fields(cls):
            tp = hints(cls)[f.name]
            if tp is float or tp == (float | None):
                out.append((name, f.name))
    return out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("method, field", _method_float_fields(), ids=lambda x: str(x))
def test_no_method_hyperparameter_takes_nan_or_infinity(method, field, value):
    """Every method's own floats too, through the same -o path; only a documented 'inf = off' takes +inf."""
    allowed = value == math.inf and field in getattr(method_class(method).Config, "allow_inf", ())
    if allowed:
        assert get_method(method, **{field: value}).cfg.__dict__[field] == math.inf
        return
    with pytest.raises(UserError) as e:
        get_method(method, **{field: value})
    assert f"{field}" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_drpo_keeps_its_documented_infinite_delta():
    cfg = resolve(load_config(overrides=["method.name=drpo", "method.delta=.inf"]))
    assert cfg.method.params["delta"] == math.inf
    assert "method: delta must be > 0" in refused("method.name=drpo", "method.delta=.nan")


def test_a_huge_integer_in_a_config_file_is_one_line(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("train:\n  steps: " + "9" * 5000 + "\n")
    with pytest.raises(UserError, match=r"big.yaml: a value could not be read \(Exceeds the limit \(4300 digits\)"):
        load_config(path)


# --- 3. message length


def _alias_bomb(levels: int, width: int) -> str:
    lines = ["x-anchors:", "  a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\ntrain:\n  steps: *a{levels}\n"


def test_the_yaml_alias_bomb_is_refused_quickly_and_briefly(tmp_path):
    """~600 bytes that expand to 10^9 values under train.steps once gave a 351 MB 'one-line' error."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(8, 10))
    assert len(path.read_bytes()) < 700
    t0 = time.perf_counter()
    with pytest.raises(UserError) as e:
        load_config(path)
    assert time.perf_counter() - t0 < 5
    assert "expands to more than" in str(e.value) and len(str(e.value)) < 200, str(e.value)


def test_a_big_value_under_the_alias_cap_is_echoed_short(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(_alias_bomb(1, 50))  # 2,500 values under train.steps: under the cap, so the type check sees them
    with pytest.raises(UserError) as e:
        load_config(path)
    message = str(e.value)  # also names the two unknown x-anchors keys, each with file:line
    assert "; train.steps: expected int, got [['x', 'x', " in message and len(message) < 800, message


def test_short_and_capped():
    assert len(short(list(range(10**5)))) <= 120 and short("x" * 10**6).endswith("'")
    assert short(10**5000) == "<a int>" or len(short(10**5000)) <= 120  # past Python's 4,300-digit repr limit
    assert capped("y" * 2500) == "y" * 2000 + "... (500 more characters)" and capped("short") == "short"


def test_the_cli_prints_at_most_max_message_chars(capsys):
    """Many bad keys make one long message: the printed line is capped and says how much was left out."""
    overrides = [a for i in range(300) for a in ("-o", f"train.no_such_key_{i}=1")]
    code, err = run_cli(["train", *overrides], capsys)
    line = error_line(err)
    assert code == 2 and line.startswith("error: 300 config errors: unknown config key 'train.no_such_key_0'"), line[:200]
    assert len(line) <= len("error: ") + MAX_MESSAGE_CHARS + 40 and line.endswith("more characters)"), line[-80:]


# --- 2. thinkrl eval values


@pytest.mark.parametrize(
    "change, message",
    [
        ({"temperature": math.nan}, r"--temperature must be a finite number >= 0 \(0 = greedy\), got nan"),
        ({"temperature": math.inf}, r"--temperature must be a finite number >= 0 \(0 = greedy\), got inf"),
        ({"seed": 99999999999999999999}, r"--seed must be in \[0, 4294967295\] \(a 32-bit seed\), got 99999999999999999999"),
        ({"seed": -1}, r"--seed must be in \[0, 4294967295\]"),
        ({"n": 100000000000}, r"--n 100000000000: at most 100000 samples per problem \(one problem's n completions"),
        ({"top_p": math.nan}, r"--top-p must be in \(0, 1\] \(1 = off\), got nan"),
        ({"n": 0}, r"--n must be >= 1 \(samples per problem\), got 0"),
        ({"max_new_tokens": -5}, r"--max-new-tokens must be >= 1 \(the completion budget in tokens\), got -5"),
    ],
)
def test_eval_settings_are_checked(change, message):
    with pytest.raises(UserError, match=message):
        resolve_settings(EvalSettings(model="m", dataset="", **change), Config())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "nan", "--n", "2"], "error: --temperature must be a finite number >= 0 (0 = greedy), got nan"),
        (["--seed", "99999999999999999999"], "error: --seed must be in [0, 4294967295] (a 32-bit seed), got 99999999999999999999"),
        (["--n", "100000000000"], "error: --n 100000000000: at most 100000 samples per problem"),
        (["--n", "100000"], "error: arith: --n 100000 x 500 problems = 50,000,000 completions, more than 10,000,000"),
        (["--n", "0"], "error: --n must be >= 1 (samples per problem), got 0"),
        (["--max-new-tokens", "0"], "error: --max-new-tokens must be >= 1 (the completion budget in tokens), got 0"),
        (["--top-p", "0"], "error: --top-p must be in (0, 1] (1 = off), got 0.0"),
        (["--limit", "-1"], "error: --limit must be >= 0 (0 = every problem), got -1"),
        (["--batch-size", "0"], "error: --batch-size must be >= 1 (completions decoded together), got 0"),
    ],
)
def test_eval_cli_refuses_bad_values_before_the_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch, args, message):
    import thinkrl.evaluation.evaluate as evaluate_mod

    monkeypatch.setattr(evaluate_mod, "load_for_eval", lambda *a: pytest.fail("the model loaded"))
    code, err = run_cli(["eval", "--model", tiny_model_dir, "--dataset", "arith", "--output", tmp_path / "out", *args], capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(message), line
    assert not (tmp_path / "out" / "settings.json").exists()


def test_eval_with_an_adapter_of_another_base_model_names_both(tiny_model_dir, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    other = build_tiny_model(tmp_path / "other", heads=2)  # a smaller hidden size: the LoRA shapes differ
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(other), LoraConfig(r=4, target_modules="all-linear"))
    model.save_pretrained(tmp_path / "adapter")
    args = ["eval", "--model", tiny_model_dir, "--adapter", tmp_path / "adapter", "--dataset", "arith", "--limit", "1"]
    code, err = run_cli([*args, "--output", tmp_path / "out"], capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: --adapter {tmp_path / 'adapter'} does not fit --model {tiny_model_dir}"), line
    assert f"the adapter was trained on {other}" in line and "size mismatch" in line, line
