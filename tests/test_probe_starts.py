"""A probe over independent starting points: the verdict is taken across starts (each start's mean paired
difference is one observation), checked against numbers worked by hand; arms resolve their recipe and
drift-scaled parameters per start; starts run as separate jobs and a start measured under other settings is
refused instead of mixed in."""

from __future__ import annotations

import json
import math

import pytest
from test_cli_e2e import tiny_args
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.probe.measure import ProbeArm
from thinkrl.probe.report import summarise


def rep(arm: float, base: float) -> dict[str, dict]:
    return {"base": {"cos_ref": base}, "arm": {"cos_ref": arm}}


# three starts, two replicates each: start means (arm, base) = (0.4, 0.2), (0.2, 0.1), (0.5, 0.3)
STARTS = [[rep(0.3, 0.1), rep(0.5, 0.3)], [rep(0.2, 0.1), rep(0.2, 0.1)], [rep(0.6, 0.3), rep(0.4, 0.3)]]


def test_the_verdict_is_a_t_test_over_start_means_worked_by_hand():
    s = summarise(STARTS, ["base", "arm"], ("cos_ref",))
    (c,) = s["comparisons"]
    d = c["paired"]
    # per-start differences 0.2, 0.1, 0.2: mean 1/6, sd sqrt(((1/30)^2 * 2 + (1/15)^2) / 2) = 0.057735
    assert s["level"] == "start" and s["starts"] == 3 and s["replicates"] == [2, 2, 2] and c["unit"] == "starts"
    assert d["n"] == 3 and d["mean_diff"] == pytest.approx(1 / 6)
    assert d["sd"] == pytest.approx(0.0577350, rel=1e-5) and c["between_start_sd"] == pytest.approx(0.0577350, rel=1e-5)
    # se = sd / sqrt(3) = 1/30; t_{0.975, 2} = 4.302653: 1/6 -+ 0.1434218
    assert (d["lower"], d["upper"]) == (pytest.approx(0.0232449, rel=1e-5), pytest.approx(0.3100884, rel=1e-5))
    # t = 5 on 2 df: p = 1 - 5 / sqrt(27) = 0.0377498 (Student's t with 2 df has a closed-form cdf)
    assert d["p"] == pytest.approx(1 - 5 / math.sqrt(27), rel=1e-5) and c["p_holm"] == pytest.approx(d["p"])
    # MDE at the start level: (t_{0.975, 2} + t_{0.8, 2}) * sd / sqrt(3) = (4.302653 + 1.060660) / 30
    assert c["mde"] == pytest.approx(0.1787771, rel=1e-5)
    # the replicate-level view within each start stays: start 1's two differences are equal (sd 0)
    assert [w["mean_diff"] for w in c["within_start"]] == pytest.approx([0.2, 0.1, 0.2])
    assert "starts" in c["verdict"]
    # the arm's own mean is over start means
    assert s["methods"]["arm"]["cos_ref"]["mean"] == pytest.approx((0.4 + 0.2 + 0.5) / 3)


def test_one_start_falls_back_to_its_replicates_and_says_so():
    s = summarise([STARTS[0]], ["base", "arm"], ("cos_ref",))
    (c,) = s["comparisons"]
    assert s["level"] == "replicate" and c["unit"] == "replicates of one start" and c["between_start_sd"] is None
    assert c["paired"]["n"] == 2 and c["paired"]["mean_diff"] == pytest.approx(0.2)


def test_an_arm_takes_its_recipes_method_values_then_its_own_and_scales_drift_values_per_start():
    drpo = ProbeArm("drpo", "drpo").resolved(max_new_tokens=48, drift=0.1)
    assert dict(drpo.params) == {"aggregation": "seq-mean-token-sum-norm", "norm_length": 48}  # as `train --method drpo`
    bare = ProbeArm("bare", "drpo", recipe=False).resolved(48, 0.1)
    assert bare.build().cfg.aggregation == "token-mean"  # its Config default, without the recipe
    ctpo = ProbeArm("c", "ctpo", (("eps_hi", {"drift": 2.0}), ("eps_lo", {"drift": 1.0}), ("p", 0.5))).resolved(48, 0.125)
    assert dict(ctpo.params) == {"eps_hi": 0.25, "eps_lo": 0.125, "p": 0.5, "norm_length": 48}
    assert ctpo.build().cfg.eps_hi == 0.25


@pytest.mark.plain
def test_starts_run_as_separate_jobs_then_summarise_across_starts(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = tiny_args(tiny_model_dir, tmp_path / "unused")
    overrides = [x for i, a in enumerate(shared) if a == "-o" and "train.steps" not in shared[i + 1] for x in ("-o", shared[i + 1])]
    args = ["probe", "--model", str(tiny_model_dir), "--methods", "grpo,cispo", "--replicates", "2", "--stale-prompts", "2",
            "--reference-prompts", "2", "--stale-updates", "1", "--starts", "2", "--output", "out", *overrides]  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, [*args, "--only-start", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "start-1.json").is_file() and not (tmp_path / "out" / "start-0.json").exists()
    assert not (tmp_path / "out" / "probe.json").exists() and "1 of 2 still to run" in result.output
    one = json.loads((tmp_path / "out" / "start-1.json").read_text())
    assert one["begin"]["seed"] == 1 and len(one["raw"]) == 2

    result = runner.invoke(app, args, catch_exceptions=False)  # start 0 now, start 1 read back, then the summary
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert report["starts"] == 2 and report["level"] == "start" and report["replicates"] == [2, 2]
    assert report["raw"][1] == one["raw"]  # the record on disk, not a rerun
    assert [b["seed"] for b in report["begins"]] == [0, 1]
    assert all(c["unit"] == "starts" and c["paired"]["n"] == 2 for c in report["comparisons"])

    edited = [a if a != "2" or i != args.index("--replicates") + 1 else "3" for i, a in enumerate(args)]
    result = runner.invoke(app, edited)  # other settings: the starts on disk were measured under the old ones
    assert result.exit_code != 0 and "start-0.json was measured with other inputs" in str(result.exception)


def test_an_output_path_in_the_way_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("a file")
    monkeypatch.setattr("thinkrl.probe.starts.run_starts", lambda *a, **k: pytest.fail("ran with the output in the way"))
    result = CliRunner().invoke(app, ["probe", "--methods", "grpo,cispo", "--output", "taken"])
    assert result.exit_code != 0 and "--output taken: a file is in the way" in str(result.exception)
