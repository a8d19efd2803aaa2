"""DPPO against the hand-worked cases in docs/methods.md, dppo."""

import math

import pytest
import torch
from batches import grad_of, probs_batch, random_batch
from helpers import assert_second_correction_refused_unless_anchor_old

from thinkrl.errors import UserError
from thinkrl.methods import get_method


@pytest.mark.parametrize(
    "pi, adv, kept",
    [
        (0.7, 1.0, False),  # pi - mu = +0.2 > 0.15 under A > 0 -> masked
        (0.6, 1.0, True),  # +0.1 <= 0.15 -> kept
        (0.3, -1.0, False),  # -0.2 < -0.15 under A < 0 -> masked
        (0.3, 1.0, True),  # moving down under A > 0 is not restricted (-0.2 <= 0.15)
    ],
)
def test_dppo_binary_tv_mask(pi, adv, kept):
    # mu = 0.5, delta = 0.15; a kept token has gradient -A min(r, C) with r = pi / mu (d(-A r)/d logp = -A r)
    logp, batch = probs_batch([[pi]], [[0.5]], [adv])
    loss, grad, metrics = grad_of(get_method("dppo"), logp, batch)
    assert metrics["mask/frac"].item() == (0.0 if kept else 1.0)
    expected = -adv * pi / 0.5 if kept else 0.0
    assert grad.item() == pytest.approx(expected, rel=1e-6)
    # the loss value: -A r log pi keep, divided by num_seqs * L with L = T = 1 (norm_length 0 outside the trainer)
    assert loss.item() == pytest.approx(-adv * pi / 0.5 * math.log(pi) if kept else 0.0, rel=1e-6)


def test_dppo_inside_region_gradient_is_that_of_minus_A_r():
    # several tokens inside the region, token-mean: d/dlogp of mean(-A r) is -A r / n at each token
    pi, mu = [[0.55, 0.4, 0.2, 0.9]], [[0.5, 0.45, 0.3, 0.8]]
    logp, batch = probs_batch(pi, mu, [1.0])
    _, grad, metrics = grad_of(get_method("dppo", aggregation="token-mean"), logp, batch)
    assert metrics["mask/frac"].item() == 0.0
    logp2, batch2 = probs_batch(pi, mu, [1.0])
    is_loss = (-batch2.advantages * torch.exp(logp2 - batch2.behav_logp)).mean()
    is_loss.backward()
    assert torch.allclose(grad, logp2.grad, atol=1e-7)


def test_dppo_truncates_the_detached_ratio():
    # A = -1, mu = 0.01, pi = 0.5: pi rose under a negative advantage (against it) -> kept; r = 50 > C = 10
    # gradient = -A min(r, C) = 10
    logp, batch = probs_batch([[0.5]], [[0.01]], [-1.0])
    _, grad, metrics = grad_of(get_method("dppo"), logp, batch)
    assert grad.item() == pytest.approx(10.0)
    assert metrics["ratio/trunc_frac"].item() == 1.0 and metrics["ratio/mean"].item() == pytest.approx(50.0, rel=1e-5)


@pytest.mark.parametrize(
    "pi, mu, adv, kept",
    [
        # D = 0.5 ln(0.5/0.7) + 0.5 ln(0.5/0.3) = 0.5 (-0.336472) + 0.5 (0.510826) = 0.087177 > 0.05, pi > mu
        (0.7, 0.5, 1.0, False),
        # D = 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = 0.5 (-0.182322) + 0.5 (0.223144) = 0.020411 <= 0.05
        (0.6, 0.5, 1.0, True),
        # D = 0.087177 > 0.05 and pi < mu under A < 0 -> masked
        (0.3, 0.5, -1.0, False),
        # pi < mu under A > 0: never masked, whatever D
        (0.3, 0.5, 1.0, True),
        # TV would keep (0.99 - 0.9 = 0.09 <= 0.15) but Binary-KL does not:
        # D = 0.9 ln(0.9/0.99) + 0.1 ln(0.1/0.01) = 0.9 (-0.095310) + 0.1 (2.302585) = 0.144479 > 0.05
        (0.99, 0.9, 1.0, False),
        # low-probability token: D = 0.01 ln(0.01/0.05) + 0.99 ln(0.99/0.95) = -0.016094 + 0.040830 = 0.024735 <= 0.05
        (0.05, 0.01, 1.0, True),
    ],
)
def test_dppo_binary_kl_mask(pi, mu, adv, kept):
    logp, batch = probs_batch([[pi]], [[mu]], [adv])
    m = get_method("dppo", divergence="kl")
    assert (m.cfg.delta_low, m.cfg.delta_high) == (0.05, 0.05)  # the kl default
    _, grad, metrics = grad_of(m, logp, batch)
    assert metrics["mask/frac"].item() == (0.0 if kept else 1.0)
    assert grad.item() == pytest.approx(-adv * min(pi / mu, 10.0) if kept else 0.0, rel=1e-5)


def test_dppo_tv_keeps_the_token_binary_kl_masks():
    # the (0.99, 0.9) case above under tv: 0.09 <= 0.15 -> kept, gradient -A r = -1.1
    logp, batch = probs_batch([[0.99]], [[0.9]], [1.0])
    _, grad, _ = grad_of(get_method("dppo"), logp, batch)
    assert grad.item() == pytest.approx(-1.1, rel=1e-5)


def test_dppo_anchor_old_uses_pi_old():
    # mu = 0.5 but pi_old = 0.65: pi = 0.7 is +0.05 from pi_old (kept, r = 0.7/0.65) though +0.2 from mu
    logp, batch = probs_batch([[0.7]], [[0.5]], [1.0], old=[[0.65]])
    _, grad, _ = grad_of(get_method("dppo", anchor="old"), logp, batch)
    assert grad.item() == pytest.approx(-0.7 / 0.65, rel=1e-5)


def test_dppo_wide_region_reduces_to_truncated_is_gradient():
    logp, batch = random_batch()
    _, grad, metrics = grad_of(get_method("dppo", delta_low=1.0, delta_high=1.0, aggregation="token-mean"), logp, batch)
    assert metrics["mask/frac"].item() == 0.0
    w = torch.exp(logp.detach() - batch.behav_logp).clamp(max=10.0)
    assert torch.allclose(grad, -batch.advantages * w * batch.mask / batch.num_tokens, atol=1e-7)


def test_dppo_config_is_validated():
    with pytest.raises(UserError, match="delta_high must be > 0"):
        get_method("dppo", delta_high=0.0)
    with pytest.raises(UserError, match="delta_low must be in"):
        get_method("dppo", delta_low=1.5)
    assert get_method("dppo", divergence="kl", delta_low=1.5).cfg.delta_low == 1.5  # a KL has no upper bound
    with pytest.raises(UserError, match="ratio_cap must be > 0"):
        get_method("dppo", ratio_cap=0.0)
    with pytest.raises(UserError, match="not one of"):
        get_method("dppo", divergence="js")


@pytest.mark.parametrize("mode", ["tis", "mis", "icepop", "ipo"])
def test_dppo_refuses_a_second_rollout_correction_unless_anchored_at_pi_old(mode):
    assert_second_correction_refused_unless_anchor_old("dppo", mode)
