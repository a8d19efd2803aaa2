"""bench/reproduce.py and bench/repro_report.py: the verdicts on hand-made result JSONs (a clear win, a clear
loss, an overlap, missing seeds, a claim not run), the measures, every arm's config, and (slow) the --smoke
path for one claim on the tiny model, run twice to check that finished runs are skipped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import repro_report as rr  # noqa: E402
import repro_stats as rs  # noqa: E402
import reproduce  # noqa: E402


def result(claim: str, arm: str, seed: int, acc: float, grad: list[float] | None = None, gt2: list[float] | None = None) -> dict:
    grad = grad or [1.0, 1.1, 0.9, 1.0]
    trace = {
        "step": list(range(1, len(grad) + 1)),
        "grad_norm": grad,
        "entropy": [1.0 - 0.1 * i for i in range(len(grad))],
        "update/optimizer_steps": [1] * len(grad),
        "frac_reward_zero_std": [0.0] * len(grad),
        "mismatch/ratio_gt2_frac": gt2 or [0.0] * len(grad),
    }
    return {
        "claim": claim,
        "arm": arm,
        "seed": seed,
        "command": f"thinkrl train --method x -o train.seed={seed}",
        "accuracy": {"avg@1": acc},
        "trace": trace,
    }


def write(results: Path, r: dict) -> None:
    path = results / r["claim"] / r["arm"] / f"seed-{r['seed']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r))


def test_verdicts_win_loss_overlap_pending_and_not_run(tmp_path):
    results = tmp_path / "results"
    arms = {
        "m": [0.60, 0.61, 0.62],
        "low": [0.30, 0.31, 0.32],  # the method clearly higher: reproduced
        "high": [0.90, 0.91, 0.92],  # clearly lower: not reproduced
        "wide": [0.45, 0.61, 0.77],  # overlap: inconclusive
        "short": [0.30, 0.31],  # 2 of 3 seeds: pending however clear
    }
    for arm, accs in arms.items():
        for seed, acc in enumerate(accs):
            write(results, result("c", arm, seed, acc))
    claims = {
        "c": rr.Claim(
            "m", "is better", ("x=1",), "why", {a: ("grpo", ()) for a in arms}, ("accuracy",), ("grad_norm", "entropy"), "caveat"
        ),
        "later": rr.Claim("n", "not run", (), "why", {"n": ("n", ()), "b": ("grpo", ())}, ("accuracy",), ("entropy",), "caveat"),
    }
    doc = rr.write_report(
        claims, results, tmp_path / "docs" / "r.md", tmp_path / "docs" / "r", lambda c, a: f"thinkrl train {c} {a}", "# T"
    )
    text = doc.read_text()
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| held-out accuracy")}
    assert rows["low"].endswith("| reproduced |")
    assert rows["high"].endswith("| not reproduced |")
    assert rows["wide"].endswith("| inconclusive |")
    assert rows["short"].endswith("| pending, 2 of 3 seeds |")
    assert "Not run yet: `python bench/reproduce.py --claims later`" in text and "`thinkrl train later n`" in text
    assert "train.seed=K" in text  # each arm's command, from its results, with the seed left open
    assert (tmp_path / "docs" / "r" / "c.png").is_file() and "](r/c.png)" in text


def test_intervals_and_direction():
    m, half = rs.mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and half == pytest.approx(4.302653 / 3**0.5, rel=1e-5)  # t(0.975, 2) = 4.3027
    assert rs.t_quantile(0.975, 1) == pytest.approx(12.7062, rel=1e-4) and rs.t_quantile(0.975, 30) == pytest.approx(2.0423, rel=1e-4)
    d, dh = rs.welch([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert d == 0 and rr.verdict(d, dh, +1, 3) == "inconclusive"
    assert rr.verdict(-0.5, 0.1, -1, 3) == "reproduced"  # lower is the claim (exploding steps, variability)
    assert rr.verdict(0.5, 0.1, 0, 3) == "descriptive"


def test_stability_measures():
    # 4 trained steps, one grad spike (10 > 5 x median 1.05) and one step with 10% of ratios above 2; a step
    # without reward signal (every group equal) is left out of both
    r = result("c", "a", 0, 0.5, grad=[1.0, 1.1, 10.0, 1.0, 0.0], gt2=[0.0, 0.1, 0.0, 0.0, 0.0])
    r["trace"]["frac_reward_zero_std"][-1] = 1.0
    assert rr.unstable_frac(r) == 0.5
    g = [1.0, 1.1, 10.0, 1.0]
    mean = sum(g) / 4
    assert rr.grad_cv(r) == pytest.approx((sum((x - mean) ** 2 for x in g) / 3) ** 0.5 / mean)
    assert rr.entropy_min(r) == pytest.approx(sum(1.0 - 0.1 * i for i in range(5)) / 5)  # the 5-step average, last step included


def test_every_arm_resolves():
    """Each arm's exact overrides resolve (a method refusing the rollout correction would fail here, not hours in)."""
    from thinkrl.config.load import parse_override
    from thinkrl.settings import load_config, resolve

    for name, claim in reproduce.CLAIMS.items():
        assert list(claim.arms)[0] == name and claim.arms[name][0] == claim.method
        for arm, (method, _) in claim.arms.items():
            cfg = resolve(load_config(None, reproduce.overrides(name, arm, 0), **{"method.name": method}))
            for key, value in map(parse_override, claim.regime):  # the regime wins over every arm's recipe
                section, field = key.split(".")
                assert getattr(getattr(cfg, section), field) == value or key == "reward.overlong_buffer", (name, arm, key)
    dirs = reproduce.run_dirs(Path("runs"))
    assert dirs["drpo", "grpo"] == dirs["sis", "grpo"] and dirs["ctpo", "grpo"] != dirs["sis", "grpo"]  # identical runs train once


@pytest.mark.slow
def test_smoke_one_claim_and_skip_when_done(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "OMP_NUM_THREADS": "2"}  # helpers.py for the grader's workers
    cmd = [
        sys.executable,
        str(BENCH / "reproduce.py"),
        "--smoke",
        "--claims",
        "ctpo",
        "--runs-dir",
        str(tmp_path),
        "--model",
        str(tiny_model_dir),
    ]
    cmd += ["-o", "verifier.grader=helpers:length_reward"]  # the tiny model never solves arithmetic: varied rewards
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for arm in ("ctpo", "grpo", "gspo"):
        r = json.loads((tmp_path / "results" / "ctpo" / arm / "seed-0.json").read_text())
        assert r["steps"] == 2 and r["accuracy"]["problems"] == 8 and len(r["trace"]["grad_norm"]) == 2
        assert "rollout.staleness=2" in r["command"] and "train.seed=0" in r["command"] and r["git_commit"]
    assert "pending, 1 of 3 seeds" in (tmp_path / "reproductions.md").read_text()
    (tmp_path / "results" / "ctpo" / "gspo" / "seed-0.json").unlink()  # its run and eval are done: recorded again, not rerun
    again = subprocess.run(cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "$ thinkrl" not in again.stdout
    # the re-recorded result describes the run (trained with 2 threads), not the invocation that wrote it
    assert json.loads((tmp_path / "results" / "ctpo" / "gspo" / "seed-0.json").read_text())["threads"] == 2
