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
