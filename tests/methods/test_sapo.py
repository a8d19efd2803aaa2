"""SAPO against hand-worked gate values (docs/methods.md, sapo)."""

import math

import pytest
from batches import grad_of, ratio_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_positive_advantage_uses_tau_pos_and_the_gradient_decays_smoothly():
    # r = 2, A = +1, tau_pos = 1: s = sigmoid(1) = 0.731059; f = 4 s / 1 = 2.924234; l = -2.924234.
    # d l / d log pi = -A 4 s (1 - s) r = -4 (0.731059)(0.268941)(2) = -1.572895 (grpo: 0, clipped)
    logp, batch = ratio_batch([[math.log(2.0)]], [1.0])
    loss, grad, metrics = grad_of(get_method("sapo"), logp, batch)
    s = sigmoid(1.0)
    assert loss.item() == pytest.approx(-4 * s) and loss.item() == pytest.approx(-2.924234, abs=1e-6)
    assert grad.item() == pytest.approx(-1.572895, abs=1e-6)
    assert metrics["gate/mean"].item() == pytest.approx(4 * s * (1 - s))


def test_negative_advantage_uses_tau_neg():
    # r = 0.5, A = -1, tau_neg = 1.05: s = sigmoid(1.05 (0.5 - 1)) = sigmoid(-0.525) = 0.371684;
    # l = -(4 s / 1.05)(-1) = 1.415938; d l / d log pi = +4 s (1 - s)(0.5) = 0.467070
    logp, batch = ratio_batch([[math.log(0.5)]], [-1.0])
    loss, grad, _ = grad_of(get_method("sapo"), logp, batch)
    assert loss.item() == pytest.approx(1.415938, abs=1e-6)
    assert grad.item() == pytest.approx(0.467070, abs=1e-6)


def test_on_policy_it_is_reinforce_and_sequences_are_averaged():
    # r = 1: f = 2 / tau, f' = 1, so the gradient is -A per token. Two sequences, seq-mean-token-mean:
    # sequence 0 (A = +1, 2 tokens): l = -2 each, mean -2; sequence 1 (A = -1, 1 valid token): l = 2 / 1.05.
    # loss = (-2 + 1.904762) / 2 = -0.047619; gradients -A / (|y_i| 2): -0.25, -0.25 and +0.5
    logp, batch = ratio_batch([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [-1.0, -1.0]], mask=[[1, 1], [1, 0]])
    loss, grad, _ = grad_of(get_method("sapo"), logp, batch)
    assert loss.item() == pytest.approx((-2 + 2 / 1.05) / 2, abs=1e-7)
    assert grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.5, 0.0])


def test_a_larger_temperature_narrows_the_gate():
    # r = 2, A = +1, tau_pos = 4: weight 4 s (1 - s) r with s = sigmoid(4) = 0.982014: 0.070651 x 2 = 0.141302
    logp, batch = ratio_batch([[math.log(2.0)]], [1.0])
    _, grad, _ = grad_of(get_method("sapo", tau_pos=4.0), logp, batch)
    assert grad.item() == pytest.approx(-0.141302, abs=1e-6)


def test_sapo_help_names_its_paper_and_config_is_validated():
    assert "arXiv 2511.20347" in method_class("sapo").help()
    with pytest.raises(UserError, match="tau_pos and tau_neg must be > 0, got 0.0 and 1.05"):
        get_method("sapo", tau_pos=0.0)
