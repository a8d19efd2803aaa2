"""`thinkrl study` refuses what would make its verdict wrong, before anything runs: duplicate arm keys, arm names
that are not plain names, a study directory that is a file or whose study.yaml is damaged, an override nested too
deeply to read. Each is one error line, never a traceback, and leaves no run behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, inject_nan, run_cli
from test_study import spec

from thinkrl.config.load import parse_override
from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl
from thinkrl.study import stats
from thinkrl.study.grid import open_study
from thinkrl.study.report import write_report
from thinkrl.study.spec import load_study, parse_study


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_an_arm_written_twice_is_refused_naming_it(tmp_path, capsys):
    path = write(
        tmp_path,
        "name: t\nseeds: 2\nmetrics: [reward/mean]\narms:\n  grpo: {method: grpo}\n  dr: {method: dr_grpo}\n  grpo: {method: gspo}\n",
    )
    # --commands: never trains, even if the check broke
    code, err = run_cli(
        ["study", str(path), "--output-dir", str(tmp_path / "st"), "--commands"], capsys
    )  # never trains, even if the check broke
    line = error_line(err)
    assert code == 2 and "key 'grpo' appears twice" in line and "line 7" in line
    assert not (tmp_path / "st").exists()  # refused before anything ran


@pytest.mark.parametrize("name", ["grpo\n", "a\tb", "a\x1bb", "grpo\r"])
def test_an_arm_name_with_a_control_character_or_newline_is_refused(name):
    with pytest.raises(UserError, match="plain directory name"):
        parse_study(spec(arms={name: {"method": "grpo"}, "dr": {"method": "dr_grpo"}}), "s.yaml")


def test_an_output_dir_that_is_a_file_is_one_error_line(tmp_path, capsys):
    path = write(tmp_path, yaml.safe_dump(spec()))
    (tmp_path / "file").write_text("mine")
    code, err = run_cli(["study", str(path), "--output-dir", str(tmp_path / "file"), "--commands"], capsys)
    assert code == 2 and "is a file, not a directory" in error_line(err)
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("damage", ["arms: [unclosed\n", "- a list\n", "name: t\nseeds: 2\ncomparisons: 5\n", "\xff\xfe not text"], ids=str)
def test_a_damaged_study_yaml_is_one_error_line_for_a_rerun_and_for_report(tmp_path, capsys, damage):
    path = write(tmp_path, yaml.safe_dump(spec()))
    out = tmp_path / "st"
    assert run_cli(["study", str(path), "--output-dir", str(out), "--commands"], capsys)[0] == 0
    (out / "study.yaml").write_bytes(damage.encode("latin-1") if "\xff" in damage else damage.encode())
    for args in (["study", str(path), "--output-dir", str(out), "--commands"], ["study", "report", str(out)]):
        code, err = run_cli(args, capsys)
        line = error_line(err)
        assert code == 2 and "study.yaml is damaged" in line and "new --output-dir" in line, line


def test_comparisons_that_are_not_a_list_are_refused():
    with pytest.raises(UserError, match="comparisons is a list"):
        parse_study(spec(comparisons=5), "s.yaml")


def test_a_deeply_nested_override_is_one_error_naming_the_key(tmp_path, capsys):
    with pytest.raises(UserError, match="-o train.lr=...: the value nests too deeply"):
        parse_override("train.lr=" + "[" * 5000)
    path = write(tmp_path, yaml.safe_dump(spec(overrides=["train.lr=" + "[" * 5000])))
    with pytest.raises(UserError, match="nests too deeply"):
        load_study(path)
    code, err = run_cli(["train", "-o", "train.lr=" + "[" * 5000, "--output-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "train.lr" in error_line(err) and not (tmp_path / "run").exists()


@pytest.mark.plain
def test_a_skipped_step_logs_its_entropy_as_nan_and_every_step_its_thread_count(tiny_model_dir, tmp_path, monkeypatch):
    """A step whose every update was skipped as NaN/inf measured no entropy: nan, never 0.0 (which a study would
    average as a real value). Every metrics line records torch's thread count."""
    out = tmp_path / "run"
    inject_nan(monkeypatch, {2})
    invoke(tiny_args(tiny_model_dir, out, 3, "-o", "train.max_nonfinite_steps=0"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["update/skipped_nonfinite"] for m in metrics] == [0, 1, 0]
    assert metrics[1]["entropy"] == "nan" and metrics[1]["loss"] == "nan"
    assert all(isinstance(metrics[i]["entropy"], float) and metrics[i]["entropy"] > 0 for i in (0, 2))
    assert [m["torch/threads"] for m in metrics] == [torch.get_num_threads()] * 3


# --- seeds that diverged or did not train


def run_of(run_dir: Path, records: list[dict], seed: int) -> None:
    """A finished run directory whose metrics.jsonl holds `records` (values as metrics.jsonl writes them)."""
    steps = len(records)
    (run_dir / "checkpoints" / f"step-{steps}").mkdir(parents=True)
    (run_dir / "checkpoints" / f"step-{steps}" / "COMPLETE").write_text("")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": steps, "seed": seed}}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(records)))


def good(reward: float, threads: int = 1) -> list[dict]:
    return [
        {"reward/mean": 0.1, "update/skipped_nonfinite": 0, "torch/threads": threads},
        {"reward/mean": reward, "torch/threads": threads},
    ]


def test_a_diverged_or_untrained_seed_is_counted_and_left_out_of_the_comparison(tmp_path):
    """base trains on seeds 0-3. a: seed 0's final reward is nan (diverged: never its last finite value), seed 1
    skipped an update (did not train); b: every seed skipped every update. Hand-worked: a - base over seeds 2, 3
    only = [0.2, 0.3]; b gets no verdict."""
    s = parse_study(
        spec(
            seeds=4,
            arms={"base": {"method": "grpo"}, "a": {"method": "gspo"}, "b": {"method": "cispo"}},
            baseline="base",
            metrics=["reward/mean"],
        ),
        "s",
    )
    d = tmp_path / "st"
    open_study(s, d)
    for seed in range(4):
        run_of(d / "runs" / "base" / f"seed-{seed}", good(0.5, threads=1 if seed else 2), seed)
        skipped = [{"reward/mean": 0.5, "update/skipped_nonfinite": 1, "entropy": "nan"}] * 2
        run_of(d / "runs" / "b" / f"seed-{seed}", skipped, seed)
    run_of(d / "runs" / "a" / "seed-0", [{"reward/mean": 0.9}, {"reward/mean": "nan"}], 0)
    run_of(d / "runs" / "a" / "seed-1", [{"reward/mean": 0.9, "update/skipped_nonfinite": 1}, {"reward/mean": 0.9}], 1)
    run_of(d / "runs" / "a" / "seed-2", good(0.7), 2)
    run_of(d / "runs" / "a" / "seed-3", good(0.8), 3)
    result = write_report(s, d)
    a_arm, b_arm = result["arms"]["a"]["reward/mean"], result["arms"]["b"]["reward/mean"]
    assert a_arm["n"] == 2 and a_arm["diverged"] == [0] and a_arm["did_not_train"] == [1] and a_arm["mean"] == pytest.approx(0.75)
    assert b_arm["n"] == 0 and b_arm["did_not_train"] == [0, 1, 2, 3]
    a, b = result["comparisons"]
    assert a["seeds"] == [2, 3] and a["left_out"] == [0, 1]
    assert a["paired"]["mean_diff"] == pytest.approx(stats.paired_difference([0.7, 0.8], [0.5, 0.5]).mean_diff)
    assert "2 finished seed(s) left out" in a["verdict"]
    assert b["paired"] is None and b["p_holm"] is None and "no verdict for b vs base: b has no sound seed (4 did not train" in b["verdict"]
    text = (d / "report.md").read_text()
    assert "| a | 2 | 0.75 |" in text and "| 1 | 1 |" in text and "| b | 0 | - | - to - | 0 | 4 |" in text
    assert "| a - base | reward/mean | 2 (2 left out) |" in text
    assert "different torch thread counts" in text and "base/seed-0: 2" in text and "base/seed-1: 1" in text
    json.loads((d / "report.json").read_text())


def test_one_thread_count_adds_no_note(tmp_path):
    s = parse_study(spec(), "s")
    d = tmp_path / "st"
    open_study(s, d)
    for arm in ("grpo", "dr"):
        for seed in (0, 1):
            run_of(d / "runs" / arm / f"seed-{seed}", good(0.5 + seed / 10 + (arm == "dr") / 5), seed)
    write_report(s, d)
    assert "thread counts" not in (d / "report.md").read_text()


def test_no_spread_leaves_the_minimum_detectable_effect_undefined():
    paired = stats.paired_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])  # every difference 0: no spread
    words = stats.verdict(paired, 1.0, stats.minimum_detectable_effect(paired.sd, paired.n))
    assert "no difference detected" in words and "detect a true difference of 0" not in words
    assert "minimum detectable effect is undefined: the paired differences have no spread" in words


NAN_PLUGIN = '''"""nanpg: a loss that is always NaN, so every update is skipped (a method that does not train)."""

from dataclasses import dataclass

from thinkrl.methods import Method, register
from thinkrl.methods._common import Reduction


@dataclass
class Config(Reduction):
    """The shared reduction fields only."""


@register("nanpg_study_test")
class NanPG(Method[Config]):
    """Always NaN."""

    def loss(self, batch):
        return (batch.logp * float("nan")).sum(), {}
'''


@pytest.mark.plain
def test_a_method_that_never_trains_gets_no_verdict_and_changed_inputs_are_refused(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """grpo against a plugin whose loss is always NaN, 2 steps (under train.max_nonfinite_steps): every update of
    nanpg is skipped, so its seeds did not train and the study states no verdict. Then the study's config file and
    its plugin change: a rerun in the same directory is refused naming the file, and nothing more runs."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "nanpg.py").write_text(NAN_PLUGIN)
    config = tmp_path / "regime.yaml"
    config.write_text("train:\n  lr: 0.05\n")
    shared = tiny_args(tiny_model_dir, tmp_path / "unused", 2)
    overrides = [shared[i + 1] for i, a in enumerate(shared) if a == "-o" and not shared[i + 1].startswith("train.lr")]
    raw = spec(
        overrides=[*overrides, f"model.name={tiny_model_dir}"],
        arms={"grpo": {"method": "grpo"}, "nanpg": {"method": "nanpg_study_test"}},
        metrics=["reward/mean", "entropy"],
        config=str(config),
        plugins=str(plugins),
    )
    path = write(tmp_path, yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "st"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p))
    code = run_cli(["study", str(path), "--output-dir", str(out), "--jobs", "2"], capsys)[0]
    printed = capsys.readouterr()
    result = json.loads((out / "report.json").read_text())
    assert result["arms"]["nanpg"]["reward/mean"]["did_not_train"] == [0, 1] and result["arms"]["nanpg"]["reward/mean"]["n"] == 0
    for c in result["comparisons"]:
        assert c["paired"] is None and "no verdict for nanpg vs grpo: nanpg has no sound seed (2 did not train" in c["verdict"]
    assert read_jsonl(out / "runs" / "nanpg" / "seed-0" / "metrics.jsonl")[0]["entropy"] == "nan"
    assert code == 0, printed
    assert json.loads((out / "inputs.json").read_text()).keys() == {str(config), str(plugins / "nanpg.py")}

    runs = sorted(p.name for p in (out / "runs").rglob("*"))
    config.write_text("train:\n  lr: 0.5\n")  # the regime changed under the finished runs
    code, err = run_cli(["study", str(path), "--output-dir", str(out)], capsys)
    line = error_line(err)
    assert code == 2 and f"{config} changed since the study in {out} started" in line and "new --output-dir" in line
    config.write_text("train:\n  lr: 0.05\n")  # restored: accepted again (nothing left to run)
    assert run_cli(["study", str(path), "--output-dir", str(out), "--commands"], capsys)[0] == 0
    (plugins / "nanpg.py").write_text(NAN_PLUGIN + "\n# edited\n")
    code, err = run_cli(["study", str(path), "--output-dir", str(out), "--commands"], capsys)
    assert code == 2 and f"{plugins / 'nanpg.py'} changed" in error_line(err)
    assert sorted(p.name for p in (out / "runs").rglob("*")) == runs

    # the converse of the refusal: every key a real run logged is one a study may declare
    logged = sorted({k for r in read_jsonl(out / "runs" / "grpo" / "seed-0" / "metrics.jsonl") for k in r})
    (tmp_path / "every").mkdir()
    every = write(tmp_path / "every", yaml.safe_dump({**raw, "metrics": logged}, sort_keys=False))
    code, err = run_cli(["study", str(every), "--output-dir", str(tmp_path / "st2"), "--commands"], capsys)
    assert code == 0, err


def test_a_metric_no_arm_logs_is_refused_before_anything_runs(tmp_path, capsys):
    """The trainer's keys, the eval/ family and what each arm's method returns are known; a typo is not. gspo logs
    ratio/seq_mean, grpo does not; grpo logs kl/ref only with method.beta > 0."""
    for metrics, bad in [
        (["reward/mean", "rewrd/mean"], "rewrd/mean"),
        (["kl/ref"], "kl/ref"),
        (["reward/mean", "ratio/seq_mean", "entropy", "eval/arith/accuracy", "torch/threads"], None),
    ]:
        path = write(tmp_path, yaml.safe_dump(spec(arms={"grpo": {"method": "grpo"}, "gspo": {"method": "gspo"}}, metrics=metrics)))
        out = tmp_path / f"st-{bad}"
        code, err = run_cli(["study", str(path), "--output-dir", str(out), "--commands"], capsys)
        if bad is None:
            assert code == 0, err
            continue
        line = error_line(err)
        assert code == 2 and f"metric {bad!r} is logged by no arm" in line and "known: " in line and "ratio/seq_mean" in line
        assert not out.exists()
    path = write(tmp_path, yaml.safe_dump(spec(metrics=["kl/ref"], overrides=["train.steps=2", "method.beta=0.04"])))
    assert run_cli(["study", str(path), "--output-dir", str(tmp_path / "beta"), "--commands"], capsys)[0] == 0
