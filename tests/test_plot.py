"""`thinkrl plot` on hand-written run directories: --metrics panels, seeds drawn as a mean and band, runs
that share a label both drawn, the raw trace under the smoothed one, integer step ticks."""

import json

import pytest
import yaml
from matplotlib.collections import PolyCollection
from matplotlib.ticker import MaxNLocator
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.run.plot import draw
from thinkrl.run.readers import load_runs, seed_groups

DEFAULT_TITLES = ["Reward", "Entropy", "Completion length", "Clipped / masked tokens"]


def write_run(path, rewards, seed=0, method="grpo", lr=1e-5, extra=None):
    """A run directory: config.yaml and one metrics.jsonl line per reward (steps 1, 2, ...)."""
    path.mkdir(parents=True)
    config = {"method": {"name": method}, "train": {"seed": seed, "lr": lr}, "output_dir": str(path)}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": i + 1, "reward/mean": r, "entropy": 1.0, **(extra or {})} for i, r in enumerate(rewards)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.get_title()]


def labelled(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_metrics_globs_give_one_panel_per_key(tmp_path):
    extra = {"ratio/mean": 1.0, "ratio/max": 1.2, "mismatch/kl": 0.01, "prefix/len": 3}
    runs = load_runs([write_run(tmp_path / "a", [0.1, 0.2], extra=extra)])
    assert titles(draw(runs)) == DEFAULT_TITLES  # no eval/ keys: no held-out panel
    assert titles(draw(runs, metrics=["ratio/*"])) == ["ratio/mean", "ratio/max"]
    patterns = ["mismatch/kl", "ratio/*", "ratio/mean", "pre*"]  # a key named twice gets one panel
    assert titles(draw(runs, metrics=patterns)) == ["mismatch/kl", "ratio/mean", "ratio/max", "prefix/len"]
    with pytest.raises(UserError, match=r"--metrics clip/\*: no metrics.jsonl key matches; logged keys: reward/mean, entropy, ratio/mean"):
        draw(runs, metrics=["clip/*"])


def test_runs_that_differ_only_in_seed_are_a_mean_and_a_band(tmp_path):
    a = write_run(tmp_path / "s1", [0.0, 0.2, 0.4], seed=1)
    b = write_run(tmp_path / "s2", [0.2, 0.4, 1.0], seed=2)
    c = write_run(tmp_path / "other-lr", [0.5, 0.5, 0.5], seed=1, lr=1e-4)
    runs = load_runs([a, b, c])
    assert [(label, len(members)) for label, members in seed_groups(runs)] == [
        ("grpo (2 seeds: mean, min-max band)", 2),
        ("grpo (other-lr)", 1),
    ]
    ax = draw(runs).axes[0]
    lines = labelled(ax)
    assert set(lines) == {"grpo (2 seeds: mean, min-max band)", "grpo (other-lr)"}
    assert list(lines["grpo (2 seeds: mean, min-max band)"].get_ydata()) == pytest.approx([0.1, 0.3, 0.7])
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.0) and max(ys) == pytest.approx(1.0)


def test_two_seed_groups_of_one_method_are_told_apart(tmp_path):
    dirs = [write_run(tmp_path / f"lr{lr}-s{s}", [0.1 * s], seed=s, lr=lr) for lr in (1e-5, 1e-4) for s in (1, 2)]
    assert [label for label, _ in seed_groups(load_runs(dirs))] == [
        "grpo train.lr=1e-05 (2 seeds: mean, min-max band)",
        "grpo train.lr=0.0001 (2 seeds: mean, min-max band)",
    ]


def test_runs_with_the_same_label_are_both_drawn(tmp_path):
    # same method, same seed, same directory name, same curve: a repeat, not a band of seeds
    a = write_run(tmp_path / "x" / "run", [0.1, 0.2, 0.3])
    b = write_run(tmp_path / "y" / "run", [0.1, 0.2, 0.3])
    runs = load_runs([a, b])
    assert len({r.label for r in runs}) == 2 and all(str(tmp_path) in r.label for r in runs)
    lines = labelled(draw(runs).axes[0])
    assert len(lines) == 2 and len({line.get_linestyle() for line in lines.values()}) == 2  # dashed over solid
    same = load_runs([a, a])
    assert [r.label for r in same] == [f"grpo ({a}) #1", f"grpo ({a}) #2"]


def test_raw_trace_under_the_smoothed_line_and_integer_ticks(tmp_path):
    runs = load_runs([write_run(tmp_path / "a", [0.0, 1.0, 0.0])])
    ax = draw(runs, window=2).axes[0]
    raw, smoothed = ax.get_lines()
    assert list(raw.get_ydata()) == [0.0, 1.0, 0.0] and raw.get_alpha() < 0.5 and raw.get_label().startswith("_")
    assert list(smoothed.get_ydata()) == [0.0, 0.5, 0.5] and smoothed.get_label() == "grpo"
    assert len(draw(runs).axes[0].get_lines()) == 1  # no smoothing: the raw line only
    assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
    ax.figure.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_held_out_panel_and_cli_metrics(tmp_path):
    run = write_run(tmp_path / "a", [0.1, 0.2, 0.3], extra={"eval/arith/avg@4": 0.5, "ratio/mean": 1.0})
    assert titles(draw(load_runs([run]))) == [*DEFAULT_TITLES, "Held-out accuracy"]
    ax = draw(load_runs([run]), window=3, metrics=["eval/*"]).axes[0]
    (line,) = ax.get_lines()  # held-out accuracy: markers, never smoothed, no raw trace
    assert line.get_marker() == "o" and list(line.get_ydata()) == [0.5, 0.5, 0.5]
    out = tmp_path / "fig.png"
    result = CliRunner().invoke(app, ["plot", str(run), "--metrics", "ratio/*,eval/*", "--metrics", "entropy", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = CliRunner().invoke(app, ["plot", str(run), "--metrics", "nope", "--out", str(out)])
    assert bad.exit_code != 0 and "no metrics.jsonl key matches" in str(bad.exception)
