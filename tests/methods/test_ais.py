"""AIS against the hand-worked cases in docs/methods.md, ais; its adaptive alpha and its state."""

import math

import pytest
import torch
from batches import CONFIGS, grad_of, logp_batch, random_lists, roundtrip, straight_and_resumed

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods.ais import Config as AISConfig
from thinkrl.methods.ais import ais_diagnostics, ais_weights
from thinkrl.settings import load_config, resolve, resolve_with_method

RHO = [1.0, 1.2, 0.8, 1.5]
ADV = [1.0, 1.0, -1.0, -1.0]


def test_ais_worked_example_diagnostics():
    # R = (sum rho)^2 / (N sum rho^2) = 4.5^2 / (4 * 5.33) = 20.25 / 21.32 = 0.949812
    # K = mean(rho - 1 - ln rho) = (0 + 0.017678 + 0.023144 + 0.094535) / 4 = 0.033839; S = 1 - e^(-K/0.05) = 0.491751
    # rho A = [1, 1.2, -0.8, -1.5], mean -0.025, population var 1.331875; Var(A) = 1 -> V = 1.331875, P = 0.750821
    # alpha = S R P = 0.350687
    d = ais_diagnostics(torch.tensor([RHO]), torch.tensor([ADV]), torch.ones(1, 4, dtype=torch.bool), AISConfig())
    expected = {
        "reliability": 0.949812,
        "kl": 0.033839,
        "severity": 0.491751,
        "variance_amp": 1.331875,
        "variance_penalty": 0.750821,
        "alpha": 0.350687,
    }
    for k, v in expected.items():
        assert d[k].item() == pytest.approx(v, abs=1e-6), k
    # cv = sqrt(5.33 / 4 - 1.125^2) / 1.125 = 0.229861; 1 / (1 + cv^2) = R
    assert 1 / (1 + d["cv"].item() ** 2) == pytest.approx(0.949812, abs=1e-6)
    assert d["rho_max"].item() == pytest.approx(1.5) and d["rho_above_cap"].item() == 0.0
    assert d["rho_p50"].item() == pytest.approx(1.1)  # linear between 1.0 and 1.2
    # w = (1 - alpha) + alpha min(rho, 2) = [1.0, 1.070137, 0.929863, 1.175344]
    w = ais_weights(torch.log(torch.tensor([RHO])), torch.zeros(1, 4), 0.350687, 2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 1.070137, 0.929863, 1.175344]]), atol=1e-6)


def test_ais_worked_example_through_begin_step_and_loss():
    # 4 one-token sequences, log mu = -2, log pi_old = -2 + ln rho, on-policy logp = old (r = 1) -> l = -A.
    # seq-mean-token-mean over 4 = token mean: -(1 + 1.070137 - 0.929863 - 1.175344) / 4 = 0.0087675;
    # d l / d logp_t = -A_t w_t / 4.
    old = [[-2.0 + math.log(r)] for r in RHO]
    ais = get_method("ais")
    leaf, batch = logp_batch(old, ADV, behav=[[-2.0]] * 4)
    metrics = ais.begin_step(batch)
    assert metrics["ais/alpha"].item() == pytest.approx(0.350687, abs=1e-6)
    assert metrics["ais/alpha_batch"].item() == pytest.approx(0.350687, abs=1e-6)
    assert metrics["ais/reliability"].item() == pytest.approx(0.949812, abs=1e-6)
    loss, grad, m = grad_of(ais, *logp_batch(old, ADV, behav=[[-2.0]] * 4))
    w = torch.tensor([1.0, 1.070137, 0.929863, 1.175344])
    assert loss.item() == pytest.approx(0.0087675, abs=1e-6)
    assert torch.allclose(grad[:, 0], -torch.tensor(ADV) * w / 4, atol=1e-6)
    assert m["ais/weight_mean"].item() == pytest.approx(w.mean().item(), abs=1e-6)


def test_ais_without_mismatch_is_grpo():
    # rho = 1 everywhere: K = 0 -> S = 0 -> alpha = 0 -> w = 1 exactly -> the grpo loss and gradient, bit for bit
    logp, adv, mask, old, _ = random_lists()
    ais = get_method("ais")
    _, batch = logp_batch(logp, adv, mask, old=old)  # behav = old
    metrics = ais.begin_step(batch)
    assert metrics["ais/kl"].item() == 0.0 and metrics["ais/alpha"].item() == 0.0
    loss, grad, _ = grad_of(ais, *logp_batch(logp, adv, mask, old=old))
    ref_loss, ref_grad, _ = grad_of(get_method("grpo"), *logp_batch(logp, adv, mask, old=old))
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)


def test_ais_before_any_step_is_uncorrected_even_with_mismatch():
    args = random_lists()
    loss, grad, _ = grad_of(get_method("ais"), *logp_batch(*args))
    ref_loss, ref_grad, _ = grad_of(get_method("grpo"), *logp_batch(*args))
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)


def test_ais_forced_alpha_one_is_token_tis_with_cap():
    # alpha = 1: w = min(rho, 2), which is grpo with the trainer's TIS weights is_weights = min(rho, 2)
    logp, adv, mask, old, behav = random_lists(seed=5)
    behav = (torch.tensor(behav) - 0.9 * torch.arange(6.0) / 5).tolist()  # rho up to e^0.9 * ..., some above 2
    leaf, batch = logp_batch(logp, adv, mask, old=old, behav=behav)
    rho = torch.exp(batch.old_logp - batch.behav_logp)
    assert (rho[batch.mask] > 2).any() and (rho[batch.mask] < 1).any()
    ais = get_method("ais", alpha=1.0)
    ais.begin_step(batch)  # the forced value wins over the adaptive one
    loss, metrics = ais.loss(batch)
    loss.backward()
    leaf2, batch2 = logp_batch(logp, adv, mask, old=old, behav=behav)
    batch2.is_weights = rho.clamp(max=2.0)
    ref, _ = get_method("grpo").loss(batch2)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-7) and torch.allclose(leaf.grad, leaf2.grad, atol=1e-7)
    # alpha = 0 forced: grpo whatever the mismatch
    zero = get_method("ais", alpha=0.0)
    zero.begin_step(batch)
    assert torch.equal(zero.loss(batch)[0].detach(), get_method("grpo").loss(batch)[0].detach())


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ais_reliability_is_one_over_one_plus_cv_squared(level):
    g = torch.Generator().manual_seed(7)
    rho = torch.exp(0.5 * torch.randn(3, 5, generator=g))
    mask = torch.rand(3, 5, generator=g) > 0.3
    d = ais_diagnostics(rho, torch.randn(3, 5, generator=g), mask, AISConfig(level=level))
    assert d["reliability"].item() == pytest.approx(1 / (1 + d["cv"].item() ** 2), rel=1e-12)


def test_ais_sequence_level_reliability():
    # rows [2, 0.5] and [4, 1] -> geometric means 1 and 2 -> R = (1 + 2)^2 / (2 (1 + 4)) = 0.9;
    # token level: 7.5^2 / (4 * 21.25) = 0.661765
    rho, adv, mask = torch.tensor([[2.0, 0.5], [4.0, 1.0]]), torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool)
    assert ais_diagnostics(rho, adv, mask, AISConfig(level="sequence"))["reliability"].item() == pytest.approx(0.9)
    assert ais_diagnostics(rho, adv, mask, AISConfig())["reliability"].item() == pytest.approx(56.25 / 85)


def test_ais_equal_advantages_give_no_variance_penalty_and_junk_padding_is_ignored():
    # all A = 0: Var(A) = 0 -> V := 1, P = 1. The padded token holds rho = 1e6 and must not enter anything.
    rho = torch.tensor([[1.0, 1.2, 1e6]])
    d = ais_diagnostics(rho, torch.zeros(1, 3), torch.tensor([[True, True, False]]), AISConfig())
    assert d["variance_amp"].item() == 1.0 and d["variance_penalty"].item() == 1.0
    assert d["rho_max"].item() == pytest.approx(1.2)
    assert ais_diagnostics(rho, torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool), AISConfig())["alpha"].item() == 0.0


def test_ais_micro_batches_after_a_step_reproduce_the_full_batch():
    # alpha is a constant during the step, so w is per token and micro-batches still add up
    logp, adv, mask, old, behav = random_lists(seed=2)
    ais = get_method("ais")
    ais.begin_step(logp_batch(logp, adv, mask, old=old, behav=behav)[1])
    assert ais.alpha > 0
    full, full_grad, _ = grad_of(ais, *logp_batch(logp, adv, mask, old=old, behav=behav))
    leaf, batch = logp_batch(logp, adv, mask, old=old, behav=behav)
    total = sum(ais.loss(part)[0] for part in batch.split([1, 3]))
    total.backward()
    assert torch.allclose(total, full, atol=1e-7) and torch.allclose(leaf.grad, full_grad, atol=1e-7)


def test_ais_ema_and_state_round_trip():
    # ema 0.9. Step 1 (worked example) initialises alpha = 0.350687; step 2 has rho = 1 (alpha_batch 0):
    # alpha = 0.9 * 0.350687 + 0.1 * 0 = 0.315618. A method loaded from the saved state continues identically.
    example = logp_batch([[-2.0 + math.log(r)] for r in RHO], ADV, behav=[[-2.0]] * 4)[1]
    matched = logp_batch([[-1.0]] * 4, ADV)[1]
    ais = get_method("ais", ema=0.9)
    assert ais.begin_step(example)["ais/alpha"].item() == pytest.approx(0.350687, abs=1e-6)
    assert ais.begin_step(matched)["ais/alpha"].item() == pytest.approx(0.315618, abs=1e-6)
    resumed = get_method("ais", ema=0.9)
    resumed.load_state_dict(roundtrip(ais.state_dict()))
    assert torch.equal(ais.loss(example)[0], resumed.loss(example)[0])
    a, b = ais.begin_step(example), resumed.begin_step(example)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # 0.9 * 0.315618 + 0.1 * 0.350687 = 0.319125
    assert a["ais/alpha"].item() == pytest.approx(0.319125, abs=1e-6)
    # without the state, a fresh method would restart the EMA at 0.350687
    assert get_method("ais", ema=0.9).begin_step(example)["ais/alpha"].item() == pytest.approx(0.350687, abs=1e-6)
    with pytest.raises(ValueError, match="alpha, started"):
        resumed.load_state_dict({})


@pytest.mark.parametrize(
    "override, message",
    [
        ({"alpha": 1.5}, r"alpha must be in \[0, 1\] or None"),
        ({"ema": 1.0}, r"ema must be in \[0, 1\)"),
        ({"kappa": 0.0}, "kappa must be > 0"),
        ({"cap": -1.0}, "cap must be > 0"),
        ({"level": "seq"}, "method.level: 'seq' is not one of 'token', 'sequence'"),
    ],
)
def test_ais_config_ranges_are_validated(override, message):
    with pytest.raises(UserError, match=message):
        get_method("ais", **override)


def test_ais_alpha_accepts_none_and_numbers():
    assert get_method("ais", alpha=None).cfg.alpha is None
    assert get_method("ais", alpha=1).cfg.alpha == 1.0


def test_ais_help_names_its_paper():
    text = method_class("ais").help()
    assert "arXiv 2605.13907" in text and "Relative to grpo" in text


def test_ais_config_file_resolves():
    ais, method = resolve_with_method(load_config(CONFIGS / "ais.yaml"))  # to method.name ais: test_method_contract.py
    assert ais.rollout.precision == "fp8"
    assert ais.method.params["alpha"] is None and method.cfg.norm_length == 48  # 0 -> rollout.max_new_tokens


def test_ais_requires_and_class_flags():
    assert get_method("ais").requires == set() and not method_class("ais").batch_statistics


@pytest.mark.plain
def test_ais_resume_continues_the_controller_exactly(tiny_model_dir, tmp_path):
    # through the trainer: begin_step each step, the state saved in the checkpoint and loaded on --resume
    extra = ["-o", "rollout.precision=fp8", "-o", "method.ema=0.5"]
    runs = straight_and_resumed(tiny_model_dir, tmp_path, "-o", "method.name=ais", *extra)
    pick = lambda m: {k: v for k, v in m.items() if k in ("loss", "grad_norm", "reward/mean") or k.startswith("ais/")}  # noqa: E731
    straight, split = ([pick(m) for m in rows] for rows in runs)
    assert len(straight) == 4 and split == straight
    assert all(m["ais/alpha"] > 0 for m in straight) and "ais/reliability" in straight[0]


@pytest.mark.parametrize("mode", ["tis", "mis", "icepop", "ipo"])
def test_ais_refuses_a_second_rollout_correction(mode):
    # w_t = (1 - alpha) + alpha min(pi_old / mu, cap) is already a TIS weight; the trainer's would multiply it again
    with pytest.raises(UserError, match=rf"^correction.mode={mode} with method ais: it already weights every token by pi_old / mu") as e:
        resolve(load_config(overrides=[f"correction.mode={mode}"], **{"method.name": "ais"}))
    assert str(e.value).endswith("; set correction.mode=none") and "\n" not in str(e.value)
    assert get_method("ais").mismatch_corrected == "all"
    assert resolve(load_config(CONFIGS / "ais.yaml")).correction.mode == "none"
