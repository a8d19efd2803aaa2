"""`thinkrl study`: a declared grid of arms x paired seeds run as ordinary runs, resumable, with a report whose
numbers are the hand-checked statistics of tests/test_study_stats.py applied to the runs' metrics."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_cli_e2e import tiny_args
from test_faults import error_line, run_cli
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.study import stats
from thinkrl.study.grid import cells, command, open_study
from thinkrl.study.report import write_report
from thinkrl.study.spec import parse_study

TESTS = Path(__file__).parent


def spec(**changes) -> dict:
    d = {
        "name": "t",
        "recipe": "none",
        "overrides": ["train.steps=2"],
        "seeds": 2,
        "arms": {"grpo": {"method": "grpo"}, "dr": {"method": "dr_grpo"}},
        "baseline": "grpo",
        "metrics": [{"name": "reward/mean", "summary": "mean"}],
    }
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"arms": {"grpo": {"method": "grpo"}}}, "two or more named arms"),
        ({"arms": {"a": {"method": "grpo"}, "b": {"method": "grpo", "overrides": ["train.seed=3"]}}}, "arm b sets train.seed"),
        ({"arms": {"a": {"method": "grpo"}, "b": {"method": "grpo", "overrides": ["data.name=gsm8k"]}}}, "to stay paired"),
        ({"arms": {"a/b": {"method": "grpo"}, "c": {"method": "grpo"}}}, "plain directory name"),
        ({"seeds": 1}, "a paired test needs two or more"),
        ({"seeds": [0, 0]}, "distinct integers"),
        ({"metrics": []}, "declare the primary metrics before running"),
        ({"metrics": [{"name": "reward/mean", "summary": "last:0"}]}, "must be final, mean or last:N"),
        ({"baseline": "nope"}, "baseline 'nope' is not an arm"),
        ({"comparisons": [["grpo", "grpo"]]}, "must be [ARM, OTHER_ARM]"),
        ({"overrides": ["train.steps 2"]}, "KEY=VALUE"),
        ({"colour": "blue"}, "unknown key 'colour'"),
    ],
)
def test_a_bad_study_file_is_one_error_naming_the_key(changes, message):
    with pytest.raises(UserError, match=None) as e:
        parse_study(spec(**changes), "s.yaml")
    assert message in str(e.value)


def test_every_arm_at_seed_k_is_the_same_command_but_for_the_method_and_its_overrides(tmp_path):
    study = parse_study(spec(arms={"grpo": {"method": "grpo"}, "hot": {"method": "gspo", "overrides": ["train.lr=1e-3"]}}), "s.yaml")
    grid = cells(study, tmp_path)
    assert [(c.arm.name, c.seed) for c in grid] == [("grpo", 0), ("hot", 0), ("grpo", 1), ("hot", 1)]  # seed-major
    a, b = command(study, grid[0]), command(study, grid[1])
    assert a[3:] == [
        "train",
        "--method",
        "grpo",
        "--recipe",
        "none",
        "-o",
        "train.steps=2",
        "-o",
        "train.seed=0",
        "--output-dir",
        str(grid[0].run_dir),
    ]
    assert b[3:] == [
        "train", "--method", "gspo", "--recipe", "none", "-o", "train.steps=2", "-o", "train.lr=1e-3", "-o", "train.seed=0",
        "--output-dir", str(grid[1].run_dir),
    ]  # fmt: skip
    assert "train.seed=1" in command(study, grid[2])


def test_a_declared_study_may_not_change(tmp_path):
    open_study(parse_study(spec(), "s.yaml"), tmp_path / "st")
    open_study(parse_study(spec(), "s.yaml"), tmp_path / "st")  # the same study again: fine
    with pytest.raises(UserError, match="holds another study"):
        open_study(parse_study(spec(metrics=["entropy"]), "s.yaml"), tmp_path / "st")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("x")
    with pytest.raises(UserError, match="not empty and holds no study.yaml"):
        open_study(parse_study(spec(), "s.yaml"), tmp_path / "other")


def fake_run(run_dir: Path, steps: int, rewards: list[float], seed: int, method: str) -> None:
    """A finished run directory as training leaves it: config.yaml, the final checkpoint, metrics.jsonl."""
    (run_dir / "checkpoints" / f"step-{steps}").mkdir(parents=True)
    (run_dir / "checkpoints" / f"step-{steps}" / "COMPLETE").write_text("")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"method": {"name": method}, "train": {"steps": steps, "seed": seed}}))
    lines = [{"step": s + 1, "reward/mean": r} for s, r in enumerate(rewards)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_the_report_is_the_paired_statistics_of_the_finished_runs(tmp_path):
    """Three arms on seeds 0-3; b's seed 3 never finished. Hand-worked: a - base over seeds 0-3 = [1, 2, 1, 2] on
    the mean-of-steps summary; b - base over seeds 0-2 only."""
    s = parse_study(
        spec(seeds=4, arms={"base": {"method": "grpo"}, "a": {"method": "gspo"}, "b": {"method": "cispo"}}, baseline="base"), "s"
    )
    d = tmp_path / "st"
    open_study(s, d)
    base = {0: [1, 3], 1: [4, 4], 2: [0, 2], 3: [5, 5]}  # means 2, 4, 1, 5
    for seed, r in base.items():
        fake_run(d / "runs" / "base" / f"seed-{seed}", 2, r, seed, "grpo")
        fake_run(d / "runs" / "a" / f"seed-{seed}", 2, [x + [1, 2, 1, 2][seed] for x in r], seed, "gspo")
        if seed < 3:
            fake_run(d / "runs" / "b" / f"seed-{seed}", 2, [x + [0.5, -0.5, 0.0][seed] for x in r], seed, "cispo")
    result = write_report(s, d)
    assert result["missing"] == ["b/seed-3"]
    assert result["arms"]["base"]["reward/mean"]["mean"] == pytest.approx(3.0) and result["arms"]["base"]["reward/mean"]["n"] == 4
    a, b = result["comparisons"]
    expected_a = stats.paired_difference([3, 6, 2, 7], [2, 4, 1, 5])
    assert a["seeds"] == [0, 1, 2, 3] and a["paired"]["mean_diff"] == pytest.approx(1.5) and a["paired"]["p"] == pytest.approx(expected_a.p)
    expected_b = stats.paired_difference([2.5, 3.5, 1.0], [2, 4, 1])
    assert b["seeds"] == [0, 1, 2] and b["paired"]["mean_diff"] == pytest.approx(0.0) and b["paired"]["p"] == pytest.approx(expected_b.p)
    assert [a["p_holm"], b["p_holm"]] == pytest.approx(stats.holm([expected_a.p, expected_b.p]))
    assert b["mde"] == pytest.approx(stats.minimum_detectable_effect(expected_b.sd, 3))
    assert a["verdict"].startswith("reward/mean: a higher than base by 1.5") and "no difference detected between b and base" in b["verdict"]
    text = (d / "report.md").read_text()
    assert "| a - base | reward/mean | 4 | 1.5 |" in text and "Not finished (left out): b/seed-3." in text
    assert (d / "curves.png").stat().st_size > 0
    json.loads((d / "report.json").read_text())  # strict JSON: no NaN


def test_commands_prints_one_line_per_pending_run_and_report_reads_the_directory(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec(), sort_keys=False))
    result = CliRunner().invoke(app, ["study", str(path), "--output-dir", str(tmp_path / "st"), "--commands"])
    lines = result.output.splitlines()
    assert result.exit_code == 0 and len(lines) == 4 and all(line.startswith("thinkrl train --method ") for line in lines)
    assert "--output-dir " + str(tmp_path / "st" / "runs" / "dr" / "seed-1") in lines[3]
    code, err = run_cli(["study", "report", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "no study.yaml, so not a study directory" in error_line(err)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}


def tiny_study(tmp_path: Path, model_dir: Path, steps: int) -> Path:
    shared = tiny_args(model_dir, tmp_path / "unused", steps)
    overrides = [shared[i + 1] for i, a in enumerate(shared) if a == "-o"] + [f"model.name={model_dir}", "train.save_every=1"]
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(spec(overrides=overrides, metrics=[{"name": "reward/mean", "summary": "last:2"}, "entropy"]), sort_keys=False)
    )
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.plain
def test_a_study_runs_two_at_a_time_stops_and_resumes(tiny_model_dir, tmp_path, sig):
    """SIGTERM (a scheduler, Ctrl-C): the running runs checkpoint and the study says how to continue. SIGKILL:
    the runs get SIGTERM from the kernel (parent-death signal) and checkpoint; the restart waits for them."""
    path, out = tiny_study(tmp_path, tiny_model_dir, 6), tmp_path / "st"
    args = [sys.executable, "-m", "thinkrl", "study", str(path), "--output-dir", str(out), "--jobs", "2"]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    first = out / "runs" / "grpo" / "seed-0" / "checkpoints"
    while time.time() < deadline and not any(first.glob("step-*")):  # stop once a run is under way
        time.sleep(0.2)
    proc.send_signal(sig)
    output = proc.communicate(timeout=300)[0]
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, output
        assert f"continue with: thinkrl study {path} --output-dir {out}" in output
    else:
        assert proc.returncode == -signal.SIGKILL
    grid = cells(parse_study(yaml.safe_load((out / "study.yaml").read_text()), "s"), out)
    assert any(c.state == "partial" for c in grid) and not all(c.state == "done" for c in grid)
    again = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(c.state == "done" for c in cells(parse_study(yaml.safe_load((out / "study.yaml").read_text()), "s"), out))
    result = json.loads((out / "report.json").read_text())
    assert result["missing"] == [] and [c["metric"] for c in result["comparisons"]] == ["reward/mean", "entropy"]
    assert all(len(c["seeds"]) == 2 and c["p_holm"] is not None and c["mde"] is not None for c in result["comparisons"])
    steps = [json.loads(line)["step"] for line in (out / "runs" / "grpo" / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # the interrupted run continued where it stopped, no step twice


@pytest.mark.plain
def test_a_failing_arm_fails_the_study_naming_the_run_and_its_error(tiny_model_dir, tmp_path, capsys, monkeypatch):
    path = tiny_study(tmp_path, tiny_model_dir, 1)
    raw = yaml.safe_load(path.read_text())
    raw["arms"]["dr"]["overrides"] = ["train.lr=-1"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    code, err = run_cli(["study", str(path), "--output-dir", str(tmp_path / "st"), "--jobs", "2"], capsys)
    assert code == 2 and "2 run(s) of the study failed" in error_line(err)
    assert "dr/seed-0 failed: error: train.lr" in err.replace("\n", " ")
    result = json.loads((tmp_path / "st" / "report.json").read_text())
    assert (
        result["missing"] == ["dr/seed-0", "dr/seed-1"] and "no seed where both dr and grpo finished" in result["comparisons"][0]["verdict"]
    )
    assert not math.isnan(result["arms"]["grpo"]["reward/mean"]["mean"])
