from pathlib import Path

import pytest
import yaml

from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.settings import load_config, resolve, save_config

CONFIGS = sorted(Path(__file__).parent.parent.joinpath("configs").glob("*.yaml"))


def test_defaults_resolve_to_the_first_run():
    cfg = resolve(load_config())
    assert (cfg.method.name, cfg.model.name, cfg.data.name) == ("grpo", "smollm2-135m", "arith")
    assert cfg.method.params["clip_low"] == 0.2  # the method's defaults are filled in
    assert cfg.output_dir.startswith("runs/") and cfg.output_dir.endswith("-grpo")


def test_yaml_then_overrides_then_shorthands(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 3.0e-4\n  steps: 7\nmethod:\n  name: grpo\n  clip_high: 0.28\n")
    cfg = load_config(path, ["train.steps=9", "rollout.top_p=0.9", "method.dual_clip=3"], **{"data.name": "x.jsonl"})
    assert cfg.train.lr == 3e-4 and cfg.train.steps == 9 and cfg.rollout.top_p == 0.9
    assert cfg.method.params == {"clip_high": 0.28, "dual_clip": 3}
    assert cfg.data.name == "x.jsonl"


def test_float_written_like_1e_minus_4_is_accepted():
    assert load_config(overrides=["train.lr=1e-4"]).train.lr == 1e-4  # YAML reads 1e-4 as a string


def test_lists_accept_comma_separated_values():
    assert load_config(overrides=["model.lora.target_modules=q_proj,v_proj"]).model.lora.target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lrr=1", r"unknown config key 'train.lrr' \(did you mean train.lr\?\)"),
        ("rollout.groupsize=4", r"did you mean rollout.group_size"),
        ("train.steps=many", r"train.steps: expected int, got 'many'"),
        ("train.lr=fast", r"train.lr: expected float, got 'fast'"),
        ("model.dtype=fp64", r"model.dtype: 'fp64' is not one of"),
        ("train.steps", r"-o train.steps: an override is one argument KEY=VALUE with no spaces"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(UserError, match=message):
        load_config(overrides=[override])


def test_method_section_is_validated_against_the_method_config():
    with pytest.raises(UserError, match=r"unknown key method.clip_hi"):
        resolve(load_config(overrides=["method.clip_hi=0.3"]))
    with pytest.raises(UserError, match=r"unknown method 'nosuch'.*available: .*grpo"):
        resolve(load_config(overrides=["method.name=nosuch"]))


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.temperature=0", r"rollout.temperature must be > 0 for training"),
        ("rollout.top_p=1.5", r"rollout.top_p must be in \(0, 1\], got 1.5"),
        ("model.lora.dropout=5", r"model.lora.dropout must be in \[0, 1\), got 5"),
        ("train.adam_betas=[2, 2]", r"train.adam_betas must each be in \[0, 1\)"),
        ("train.weight_decay=-1", r"train.weight_decay must be >= 0"),
        ("verifier.workers=0", r"verifier.workers must be >= 1"),
        ("eval.preset=fast", r"eval.preset='fast': choose auto, train, greedy or reasoning"),
        ("seeds.frac_min=0.9", r"seeds.frac_min and frac_max need 0 < frac_min <= frac_max <= 1"),
    ],
)
def test_each_section_checks_its_own_fields_when_loaded(override, message):
    """Single-field checks live in the section's __post_init__ and run on the loaded values, named by path."""
    with pytest.raises(UserError, match=message):
        load_config(overrides=[override])


def test_checks_that_span_sections_are_in_resolve():
    cfg = load_config(overrides=["train.mini_batches=32"])  # each section on its own is fine
    with pytest.raises(UserError, match=r"train.mini_batches=32 exceeds the 16 completions per step"):
        resolve(cfg)
    with pytest.raises(UserError, match=r"seeds.per_group=8 must be below rollout.group_size=8"):
        resolve(load_config(overrides=["method.name=thinking_seeds", "seeds.per_group=8"]))
    with pytest.raises(UserError, match=r"reward.overlong_buffer=48 must be below rollout.max_new_tokens=48"):
        resolve(load_config(overrides=["reward.overlong_buffer=48"]))


def test_a_fractional_overlong_buffer_stays_a_fraction_through_config_yaml_and_a_resume(tmp_path):
    """DAPO's 0.2 is a share of the budget: config.yaml keeps 0.2 (not the 9 tokens it is at 48), the rollout
    works the tokens out, and a resume with another budget takes 0.2 of that one."""
    from thinkrl.rollout.collect import RolloutPlan

    cfg = resolve(load_config(overrides=["method.name=dapo"]))
    assert cfg.reward.overlong_buffer == 0.2 and RolloutPlan.from_config(cfg).overlong_buffer == 9  # int(0.2 * 48)
    save_config(cfg, tmp_path / "config.yaml")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["reward"]["overlong_buffer"] == 0.2
    resumed = resolve(load_config(tmp_path / "config.yaml", ["rollout.max_new_tokens=100"]))
    assert resumed.reward.overlong_buffer == 0.2 and RolloutPlan.from_config(resumed).overlong_buffer == 20
    assert RolloutPlan.from_config(resolve(load_config(overrides=["reward.overlong_buffer=4"]))).overlong_buffer == 4


def test_norm_length_0_is_the_budget_for_the_method_and_stays_0_in_config_yaml(tmp_path):
    """norm_length 0 means rollout.max_new_tokens: the run's method gets the budget (in a new run too, not only
    after a resume), config.yaml keeps 0, and a resume with another budget divides by the new one."""
    from thinkrl.settings import resolve_with_method

    cfg, method = resolve_with_method(load_config(overrides=["method.name=dr_grpo"]))
    assert method.cfg.norm_length == 48 and cfg.method.params["norm_length"] == 0
    save_config(cfg, tmp_path / "config.yaml")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["method"]["norm_length"] == 0
    cfg, method = resolve_with_method(load_config(tmp_path / "config.yaml", ["rollout.max_new_tokens=96"]))
    assert method.cfg.norm_length == 96 and cfg.method.params["norm_length"] == 0
    cfg, method = resolve_with_method(load_config(overrides=["method.name=dr_grpo", "method.norm_length=64"]))
    assert method.cfg.norm_length == 64 == cfg.method.params["norm_length"]  # a length the user set is kept


def test_malformed_and_missing_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(UserError, match="malformed YAML"):
        load_config(bad)
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_resolved_config_round_trips(tmp_path):
    cfg = resolve(load_config(overrides=["train.lr=2e-4", "method.clip_high=0.28"]))
    save_config(cfg, tmp_path / "config.yaml")
    again = resolve(load_config(tmp_path / "config.yaml"))
    assert again == cfg
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert written["method"]["name"] == "grpo" and written["method"]["clip_high"] == 0.28


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_and_resolves(path):
    cfg = resolve(load_config(path))
    assert isinstance(cfg, Config)


def test_configs_directory_is_not_empty():
    assert CONFIGS, "configs/*.yaml missing"


def test_ctpo_trains_in_its_papers_regime_and_an_on_policy_run_is_named():
    """--method ctpo resolves 4 mini-batches and sequence TIS from its recipe; without the recipe the run is
    on-policy, where ctpo's gradient is grpo's, and one line says so and what changes it."""
    from thinkrl.settings import on_policy_note

    cfg = resolve(load_config(**{"method.name": "ctpo"}))
    assert (cfg.train.mini_batches, cfg.correction.mode, cfg.correction.level, cfg.correction.c_max) == (4, "tis", "sequence", 5.0)
    assert cfg.method.recipe and on_policy_note(cfg) is None
    plain = resolve(load_config(recipe=False, **{"method.name": "ctpo"}))
    note = on_policy_note(plain)
    assert plain.train.mini_batches == 1 and note is not None
    assert "ctpo" in note and "train.mini_batches" in note and "method.aggregation=token-mean" in note
    assert on_policy_note(resolve(load_config(recipe=False, overrides=["rollout.staleness=2"], **{"method.name": "ctpo"}))) is None
    assert on_policy_note(resolve(load_config(**{"method.name": "grpo"}))) is None  # grpo is the baseline itself


def test_trl_and_verl_names_and_every_bad_key_in_one_message(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  num_generations: 8\ntrain:\n  learning_rate: 1e-5\n  steps: many\n")
    with pytest.raises(UserError) as e:
        load_config(path, overrides=["rollout.max_completion_length=512", "train.gradient_accumulation_steps=4"])
    text = str(e.value)
    assert text.startswith("5 config errors")
    assert "num_generations is rollout.group_size" in text and f"{path}:2" in text
    assert "learning_rate is train.lr" in text and f"{path}:4" in text
    assert "train.steps: expected int, got 'many'" in text and f"{path}:5" in text
    assert "max_completion_length is rollout.max_new_tokens" in text and "(-o rollout.max_completion_length=512)" in text
    assert "gradient_accumulation_steps" in text and "train.mini_batches" in text


def test_thinkrl_config_previews_a_file_and_overrides_marking_what_set_each_value(tmp_path):
    """`thinkrl config FILE -o ...` prints what `thinkrl train FILE -o ...` runs with: defaults < recipe < file < -o,
    each value the defaults do not give marked with its layer (the file's with its line)."""
    from typer.testing import CliRunner

    from thinkrl.cli import app

    path = tmp_path / "c.yaml"
    path.write_text("method: {name: ctpo}\nrollout:\n  group_size: 4\ntrain: {lr: 1.0e-5}\n")
    result = CliRunner().invoke(app, ["config", str(path), "-o", "train.steps=5", "-o", "train.lr=2e-5"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"# the config `thinkrl train {path} -o train.steps=5 -o train.lr=2e-5` runs with; set a key with -o KEY=VALUE"
    shown = {line.split(" = ")[0]: line.split("    ")[0] for line in lines if " = " in line and not line.startswith("#")}
    assert shown["method.name"] == f"method.name = 'ctpo'  ({path}:1)"
    assert shown["rollout.group_size"] == f"rollout.group_size = 4  ({path}:3)"  # the file over the recipe's 16
    assert shown["train.mini_batches"] == "train.mini_batches = 4  (recipe)"
    assert shown["train.lr"] == "train.lr = 2e-05  (-o)" and shown["train.steps"] == "train.steps = 5  (-o)"  # -o over the file
    assert shown["train.seed"] == "train.seed = 0" and shown["output_dir"] == "output_dir = None"  # defaults: unmarked
    assert shown["seeds.enabled"] == "seeds.enabled = False"  # resolved as the run resolves it (the default is None)
    flags = CliRunner().invoke(app, ["config", "--config", str(path), "--method", "grpo", "-o", "model.lora={rank: 8}"])
    marks = {line.split(" = ")[0]: line.split("    ")[0] for line in flags.output.splitlines() if " = " in line}
    assert flags.exit_code == 0 and marks["method.name"] == "method.name = 'grpo'  (--method)"  # the flag over the file
    assert marks["model.lora.rank"] == "model.lora.rank = 8  (-o)" and marks["model.lora.alpha"] == "model.lora.alpha = 32.0"


def test_thinkrl_config_makes_the_checks_a_run_makes():
    from typer.testing import CliRunner

    from thinkrl.cli import app

    result = CliRunner().invoke(app, ["config", "-o", "train.mini_batches=100"])
    assert isinstance(result.exception, UserError) and "train.mini_batches=100 exceeds the 16 completions per step" in str(result.exception)


def test_train_takes_its_config_as_CONFIG_or_as_dash_dash_config(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import thinkrl.train
    from thinkrl.cli import app
    from thinkrl.config.load import to_dict

    runs = []
    monkeypatch.setattr(thinkrl.train, "train", lambda cfg, **options: runs.append(cfg))
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: 1.0e-5, steps: 3}\n")
    for how in ([str(path)], ["--config", str(path)]):
        result = CliRunner().invoke(app, ["train", *how, "-o", "train.steps=4", "--output-dir", str(tmp_path / "run")])
        assert result.exit_code == 0, result.output
    assert runs[0].train.lr == 1e-5 and runs[0].train.steps == 4 and to_dict(runs[1]) == to_dict(runs[0])
