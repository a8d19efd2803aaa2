"""Trainer options shared by all methods: rollout-mismatch correction, DAPO's dynamic sampling,
overlong punishment and truncation masking."""

import math

import pytest
import torch
from test_cli_e2e import tiny_args
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.config import CorrectionConfig
from thinkrl.errors import UserError
from thinkrl.learner.correction import mismatch_stats, weights
from thinkrl.rollout.collect import overlong_penalty
from thinkrl.run.jsonl import read_jsonl
from thinkrl.run.plot import plot_runs
from thinkrl.run.readers import compare_rows, load_runs
from thinkrl.settings import load_config

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()


def logs(old, mu):
    return torch.log(torch.tensor(old)), torch.log(torch.tensor(mu))


def test_token_tis_truncates_at_c():
    # pi_old = 0.5, mu = 0.2 -> rho = 2.5 -> w = min(2.5, 2) = 2; pi_old = mu -> w = 1
    old, mu = logs([[0.5, 0.3, 0.1], [0.2, 0.4, 0.9]], [[0.2, 0.3, 0.2], [0.4, 0.4, 0.1]])
    w = weights(old, mu, MASK, CorrectionConfig(mode="tis", c_max=2.0))
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.5], [0.5, 1.0, 0.0]]))


def test_token_mis_masks_outliers():
    old, mu = logs([[0.5, 0.3, 0.1], [0.2, 0.4, 0.9]], [[0.2, 0.3, 0.2], [0.4, 0.4, 0.1]])
    w = weights(old, mu, MASK, CorrectionConfig(mode="mis", c_min=0.6, c_max=2.0))
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))  # 2.5 and 0.5 masked


def test_icepop_masks_tokens_whose_ratio_leaves_the_band():
    # rho = (2.5, 1, 0.5 | 0.5, 1): band [0.4, 2] keeps 0.5 and drops 2.5; band [0.6, 5] drops the 0.5s.
    # Kept tokens carry rho
    old, mu = logs([[0.5, 0.3, 0.1], [0.2, 0.4, 0.9]], [[0.2, 0.3, 0.2], [0.4, 0.4, 0.1]])
    w = weights(old, mu, MASK, CorrectionConfig(mode="icepop", band=[0.4, 2.0]))
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.5], [0.5, 1.0, 0.0]]))
    w = weights(old, mu, MASK, CorrectionConfig(mode="icepop", band=[0.6, 5.0]))
    assert torch.allclose(w, torch.tensor([[2.5, 1.0, 0.0], [0.0, 1.0, 0.0]]))
    assert CorrectionConfig().band == [0.5, 5.0]  # the Ring-1T report's alpha and beta


def test_ipo_masks_by_the_probability_gap_whatever_the_ratio():
    # |pi_old - mu| = (0.3, 0, 0.1 | 0.2, 0): eps 0.1 keeps the gap of 0.1 (rho 0.5) and drops 0.3 (rho 2.5)
    # and 0.2 (rho 0.5, the same ratio as the kept one); a rare token with rho = 10 and a gap of 0.009 is kept
    old, mu = logs([[0.5, 0.3, 0.1], [0.2, 0.4, 0.9]], [[0.2, 0.3, 0.2], [0.4, 0.4, 0.1]])
    w = weights(old, mu, MASK, CorrectionConfig(mode="ipo", eps=0.1))
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.5], [0.0, 1.0, 0.0]]))
    old, mu = logs([[0.01]], [[0.001]])
    assert weights(old, mu, MASK[:1, :1], CorrectionConfig(mode="ipo", eps=0.1)).item() == pytest.approx(10.0)


def test_icepop_and_ipo_settings_are_checked():
    with pytest.raises(ValueError, match=r"^mode=icepop masks single tokens: set correction.level=token"):
        CorrectionConfig(mode="icepop", level="sequence")
    with pytest.raises(ValueError, match=r"^band needs two numbers 0 <= alpha < beta, got \[5.0, 0.5\]"):
        CorrectionConfig(band=[5.0, 0.5])
    with pytest.raises(ValueError, match="^eps is a probability difference in"):
        CorrectionConfig(eps=0.0)
    # as a user meets them: one line naming the key
    with pytest.raises(UserError, match=r"^correction.mode=ipo masks single tokens: set correction.level=token"):
        load_config(overrides=["correction.mode=ipo", "correction.level=sequence"])


def test_sequence_level_uses_the_product_of_a_rows_ratios():
    # row 0: rho = 2.5 * 1 * 0.5 = 1.25 for every token; row 1: 0.5 * 1 = 0.5
    old, mu = logs([[0.5, 0.3, 0.1], [0.2, 0.4, 0.9]], [[0.2, 0.3, 0.2], [0.4, 0.4, 0.1]])
    w = weights(old, mu, MASK, CorrectionConfig(mode="tis", level="sequence", c_max=5.0))
    assert torch.allclose(w, torch.tensor([[1.25, 1.25, 1.25], [0.5, 0.5, 0.0]]))
    assert weights(old, mu, MASK, CorrectionConfig(mode="none")) is None


def test_mismatch_stats_are_zero_on_policy_and_correct_off_policy():
    old = torch.log(torch.tensor([[0.5, 0.3, 0.1], [0.2, 0.4, 0.9]]))
    zero = mismatch_stats(old, old.clone(), MASK)
    assert all(v.item() == 0 for v in zero.values())
    mu = old - torch.tensor([[math.log(3), 0, 0], [0, 0, 0]])  # one token with rho = 3
    stats = mismatch_stats(old, mu, MASK)
    assert stats["mismatch/abs_log_ratio"].item() == pytest.approx(math.log(3) / 5)
    assert stats["mismatch/k3"].item() == pytest.approx((3 - 1 - math.log(3)) / 5)
    assert stats["mismatch/ratio_gt2_frac"].item() == pytest.approx(1 / 5)


def test_overlong_penalty_is_dapos_soft_ramp():
    # budget 48, buffer 16: free up to 32 tokens, then -1/16 per token, -1 at 48
    got = overlong_penalty(torch.tensor([10, 32, 40, 48]), max_new_tokens=48, buffer=16, factor=1.0)
    assert got.tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(torch.tensor([48]), 48, 0, 1.0).tolist() == [0.0]


def run(args):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output


@pytest.mark.plain
def test_dynamic_sampling_keeps_only_groups_with_signal(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    run(
        tiny_args(
            tiny_model_dir,
            out,
            2,
            "-o",
            "rollout.dynamic_sampling=true",
            "-o",
            "rollout.max_sampling_rounds=4",
            "-o",
            "verifier.grader=helpers:even_answers_solved",
        )
    )
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m["sampling/dropped_groups"] > 0 or m["sampling/rounds"] == 1 for m in metrics)
    assert sum(m["sampling/dropped_groups"] for m in metrics) > 0
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert rollouts and all(int(r["answer"]) % 2 == 1 for r in rollouts)  # even-answer groups never trained on


@pytest.mark.plain
def test_a_step_whose_dynamic_sampling_keeps_no_group_says_so_and_logs_no_zeros(tiny_model_dir, tmp_path):
    """Before: the step line and metrics.jsonl showed loss, entropy, length and zero-std 0, like a step that trained."""
    out = tmp_path / "run"
    extra = ("-o", "rollout.dynamic_sampling=true", "-o", "rollout.max_sampling_rounds=2", "-o", "verifier.grader=helpers:shaped_grade")
    result = CliRunner().invoke(app, tiny_args(tiny_model_dir, out, 2, *extra), catch_exceptions=False)  # every score 1.0
    assert result.exit_code == 0, result.output
    lines = [x.strip() for x in result.output.splitlines() if x.strip().startswith("step ")]
    assert [x.split("  gen ")[0] for x in lines] == [
        f"step    {s}/2  nothing trained: no group had a reward spread after 2 sampling round(s) (4 groups dropped)" for s in (1, 2)
    ]
    metrics = read_jsonl(out / "metrics.jsonl")
    unmeasured = ("loss", "entropy", "grad_norm", "reward/mean", "reward/shaped_mean", "length/mean", "length/max", "frac_reward_zero_std")
    for m in metrics:
        assert (m["sampling/kept_groups"], m["sampling/dropped_groups"], m["sampling/rounds"]) == (0, 4, 2)
        assert {k: m[k] for k in unmeasured} == dict.fromkeys(unmeasured, "nan")  # JSON's spelling of NaN: never 0
    runs = load_runs([out])  # what reads metrics.jsonl skips them: plot and compare still work
    assert runs[0].series("entropy") == ([], []) and compare_rows(runs, 5)[1][0] == ["steps", "2"]
    assert plot_runs(runs, tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.plain
def test_mask_truncated_and_overlong_and_correction_run_end_to_end(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    run(
        tiny_args(
            tiny_model_dir,
            out,
            2,
            "-o",
            "reward.overlong_buffer=4",
            "-o",
            "correction.mode=tis",
            "-o",
            "correction.level=sequence",
        )
    )
    metrics = read_jsonl(out / "metrics.jsonl")
    for m in metrics:
        assert m["reward/shaped_mean"] <= m["reward/mean"]  # the punishment only subtracts
        assert m["correction/weight_mean"] == pytest.approx(1.0, abs=1e-3)  # same-precision sampler: rho ~ 1
        assert m["mismatch/abs_log_ratio"] < 1e-3
    all_truncated = tmp_path / "trunc"
    run(tiny_args(tiny_model_dir, all_truncated, 1, "-o", "rollout.mask_truncated=true", "-o", "rollout.max_new_tokens=1"))
    assert read_jsonl(all_truncated / "metrics.jsonl")[0]["grad_norm"] == 0.0  # nothing left to learn from
