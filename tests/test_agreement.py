"""The sampler-trainer agreement check (thinkrl/run/agreement.py): silent on an honest run, one warning and the
metric on an engine that samples another distribution, per-dtype thresholds that honest rounding never passes,
and the gap measured only on tokens the trainer scored with the weights that sampled them."""

from __future__ import annotations

import pytest
import torch
from test_cli_e2e import invoke, tiny_args

from thinkrl.config import Config
from thinkrl.rollout.engines import LeanEngine
from thinkrl.run.agreement import KEY, AgreementCheck, comparison_dtype, exceeds, off_because
from thinkrl.run.jsonl import read_jsonl

WARNING = "warning: sampler and trainer disagree"


def test_thresholds_follow_the_dtype_of_the_comparison():
    assert not exceeds(0.04, torch.bfloat16)  # the bundled model's honest bf16 gap is 0.033-0.040
    assert not exceeds(0.04, torch.float16)
    assert exceeds(0.01, torch.float32)  # 10,000x float32's honest 1e-6
    assert not exceeds(1e-6, torch.float32)
    assert exceeds(0.5, torch.bfloat16)
    assert not exceeds(float("nan"), torch.float32)  # measured nothing


def test_the_comparison_dtype_is_the_sampling_copys_lowest_precision():
    half_base = torch.nn.Sequential(torch.nn.Linear(2, 2).to(torch.bfloat16), torch.nn.Linear(2, 2))  # float32 adapters
    assert comparison_dtype(half_base) == torch.bfloat16
    assert comparison_dtype(torch.nn.Linear(2, 2)) == torch.float32


@pytest.mark.parametrize(
    "key, value",
    [("staleness", 1), ("precision", "fp8"), ("top_p", 0.9), ("top_k", 5), ("min_new_tokens", 2), ("agreement_every", 0)],
)
def test_the_check_is_off_where_sampler_and_trainer_need_not_agree(key, value, capsys):
    cfg = Config()
    setattr(cfg.rollout, key, value)
    assert off_because(cfg) is not None
    check = AgreementCheck(cfg, "lean", "fused decoder", torch.float32)
    upd = {KEY: 0.7}
    check.check(1, upd)
    assert KEY not in upd and WARNING not in capsys.readouterr().err


def test_checked_steps_keep_the_metric_and_the_warning_comes_once(capsys):
    cfg = Config()
    cfg.rollout.agreement_every = 3
    for precision in ("same", "bf16", "fp16"):  # a cast sampler is checked at its own dtype's threshold
        cfg.rollout.precision = precision
        assert off_because(cfg) is None
    check = AgreementCheck(cfg, "transformers", "transformers' paged continuous batching", torch.float32)
    kept = {}
    for step in range(1, 8):
        upd = {KEY: 0.5}
        check.check(step, upd)
        kept[step] = KEY in upd
    assert kept == {1: True, 2: False, 3: True, 4: False, 5: False, 6: True, 7: False}
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(WARNING)]
    assert len(lines) == 1, lines
    assert "0.5 on step 1" in lines[0] and "past the 0.001" in lines[0] and "float32" in lines[0]
    assert "engine transformers" in lines[0] and "rollout.engine=lean" in lines[0]


def test_a_step_without_an_update_defers_the_first_check():
    cfg = Config()
    check = AgreementCheck(cfg, "lean", "fused decoder", torch.float32)  # every 10 steps
    check.check(1, {})  # dynamic sampling kept no group: nothing measured
    upd = {KEY: 1e-7}
    check.check(2, upd)
    assert upd[KEY] == 1e-7


@pytest.mark.plain
def test_an_honest_float32_run_passes_silently(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 2, "-o", "rollout.agreement_every=1"))
    assert WARNING not in result.output
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m[KEY] < 1e-4 for m in metrics), [m[KEY] for m in metrics]


@pytest.mark.plain
def test_a_sampler_off_by_half_a_nat_is_named_once_and_logged(tiny_model_dir, tmp_path, monkeypatch):
    generate = LeanEngine.generate

    def skewed(self, model, req):  # an engine whose kernels compute another distribution than the trainer's
        comp = generate(self, model, req)
        comp.behav_logp = torch.where(comp.mask, comp.behav_logp + 0.5, comp.behav_logp)
        return comp

    monkeypatch.setattr(LeanEngine, "generate", skewed)
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 3, "-o", "rollout.agreement_every=1"))
    lines = [line for line in result.output.splitlines() if line.startswith(WARNING)]
    assert len(lines) == 1, result.output
    assert "past the 0.001 that float32 rounding" in lines[0] and "engine lean (fused decoder)" in lines[0], lines[0]
    assert "rollout.engine=transformers" in lines[0]
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m[KEY] for m in metrics] == pytest.approx([0.5] * 3, abs=1e-4)


@pytest.mark.plain
def test_with_the_sampler_as_pi_old_only_the_first_mini_batch_is_compared(tiny_model_dir, tmp_path):
    """train.old_policy=sampler: the second mini-batch's forward runs after an update (lr 0.05), so its log-probs
    are of other weights than the sampler's; counted, they would put the gap far past float32's threshold."""
    out = tmp_path / "run"
    extra = ("-o", "train.old_policy=sampler", "-o", "train.mini_batches=2", "-o", "rollout.agreement_every=1")
    result = invoke(tiny_args(tiny_model_dir, out, 2, *extra))
    assert WARNING not in result.output
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(m[KEY] < 1e-4 for m in metrics), [m[KEY] for m in metrics]
    assert max(m["mismatch/abs_log_ratio"] for m in metrics) > 1e-3  # the whole step's mismatch includes the updated weights
