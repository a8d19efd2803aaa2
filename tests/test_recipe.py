"""Recipes apart from losses: --recipe NAME trains one method's loss in another method's regime, --recipe none
in thinkrl's defaults, and the run says every key its recipe set."""

from __future__ import annotations

import pytest
import yaml
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, run_cli
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.config.load import load_config as plain_load
from thinkrl.config.load import to_dict
from thinkrl.errors import UserError
from thinkrl.methods import method_class
from thinkrl.settings import load_config, on_policy_note, recipe_report, resolve


def test_grpo_in_ctpos_regime_is_grpos_loss_with_every_ctpo_regime_key():
    cfg = load_config(recipe="ctpo", **{"method.name": "grpo"})
    assert cfg.method.name == "grpo" and cfg.method.recipe == "ctpo"
    assert (cfg.rollout.group_size, cfg.train.mini_batches) == (16, 4)
    assert (cfg.correction.mode, cfg.correction.level, cfg.correction.c_max) == ("tis", "sequence", 5.0)
    # the same as -o method.recipe=ctpo, and what ctpo trains with, but for the loss
    assert to_dict(load_config(overrides=["method.recipe=ctpo"], **{"method.name": "grpo"})) == to_dict(cfg)
    ctpo = load_config(**{"method.name": "ctpo"})
    assert {k: v for k, v in to_dict(ctpo).items() if k != "method"} == {k: v for k, v in to_dict(cfg).items() if k != "method"}


def test_another_methods_loss_parameters_are_left_out_and_said():
    """stare's recipe sets method.target_entropy, a parameter of stare's loss: grpo in stare's regime takes the
    regime (dynamic sampling) only, and the report names what it left out."""
    cfg = resolve(load_config(recipe="stare", **{"method.name": "grpo"}))
    assert cfg.rollout.dynamic_sampling is True and "target_entropy" not in cfg.method.params
    report = recipe_report(load_config(recipe="stare", **{"method.name": "grpo"}))
    assert report == (
        "recipe stare (the regime of stare, applied to grpo): rollout.dynamic_sampling=True; "
        "left out, as stare's loss's own parameters: method.target_entropy"
    )


def test_none_applies_no_recipe_and_the_own_recipe_is_the_default():
    assert to_dict(load_config(recipe="none", **{"method.name": "ctpo"})) == to_dict(load_config(recipe=False, **{"method.name": "ctpo"}))
    bare = load_config(recipe="none", **{"method.name": "ctpo"})
    assert bare.method.recipe is False and bare.train.mini_batches == 1
    assert recipe_report(bare) == "recipe: none (method.recipe is none: thinkrl's defaults, then your file and -o)"
    own = load_config(**{"method.name": "dapo"})
    assert own.method.recipe is True and recipe_report(own) == (
        "recipe dapo: rollout.dynamic_sampling=True, rollout.max_sampling_rounds=3, reward.overlong_buffer=0.2, reward.overlong_penalty=1.0"
    )


def test_the_report_gives_the_value_the_run_uses_where_yours_wins():
    cfg = load_config(overrides=["rollout.group_size=8"], **{"method.name": "ctpo"})
    report = recipe_report(cfg)
    assert "rollout.group_size=8 (recipe: 16, yours wins)" in report and "train.mini_batches=4," in report


def test_an_empty_recipe_says_so_plainly():
    assert method_class("cispo").recipe == {}
    cfg = load_config(**{"method.name": "cispo"})
    assert recipe_report(cfg) == "recipe: cispo's is empty (its paper's regime is thinkrl's defaults)"
    note = on_policy_note(resolve(cfg))
    assert note is not None and "cispo's own recipe sets none of them" in note and "(none)" not in note


def test_a_saved_config_keeps_the_recipe_it_was_made_with(tmp_path):
    cfg = load_config(recipe="ctpo", **{"method.name": "grpo"})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    again = plain_load(path)  # a run directory's config.yaml: every key already there, no recipe re-applied
    assert again.method.recipe == "ctpo" and to_dict(again) == to_dict(cfg)


@pytest.mark.parametrize("value", ["123", "''", "[a]"])
def test_a_recipe_that_is_not_a_name_is_refused(value):
    with pytest.raises(UserError, match="method.recipe=.*write true .*none, or a method name"):
        load_config(overrides=[f"method.recipe={value}"])


def test_bad_recipe_flags_fail_in_one_line(capsys):
    code, err = run_cli(["config", "--recipe", "bogus"], capsys)
    line = error_line(err)  # the list may hold plugin methods other tests registered
    assert code == 2 and line.startswith("error: unknown method 'bogus'; available: ais, ") and ", cispo, " in line
    code, err = run_cli(["train", "--recipe", "ctpo", "--no-recipe"], capsys)
    assert code == 2 and error_line(err) == "error: --recipe ctpo and --no-recipe disagree; keep one (--no-recipe is --recipe none)"


def test_thinkrl_config_marks_the_foreign_recipes_keys():
    result = CliRunner().invoke(app, ["config", "--method", "grpo", "--recipe", "ctpo"])
    lines = result.output.splitlines()
    assert result.exit_code == 0 and lines[1] == "# (recipe) = set by the ctpo recipe; --recipe none leaves those at their defaults"
    assert any(line.startswith("train.mini_batches = 4  (recipe)") for line in lines)
    assert any(line.startswith("method.recipe = 'ctpo'") for line in lines)


@pytest.mark.plain
def test_a_run_with_another_recipe_says_every_key_and_records_it(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 1, "--method", "grpo", "--recipe", "ctpo"))
    lines = result.output.splitlines()
    assert "method grpo, recipe ctpo" in lines[0]
    assert lines[1] == (
        "recipe ctpo (the regime of ctpo, applied to grpo): rollout.group_size=4 (recipe: 16, yours wins), train.mini_batches=4, "
        "correction.mode=tis, correction.level=sequence, correction.c_max=5.0"
    )
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["method"]["name"] == "grpo" and saved["method"]["recipe"] == "ctpo"
    assert saved["train"]["mini_batches"] == 4 and saved["correction"]["mode"] == "tis"
