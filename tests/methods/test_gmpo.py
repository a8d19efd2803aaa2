"""GMPO against hand-worked geometric means of clipped token ratios (docs/methods.md, gmpo)."""

import math

import pytest
from batches import grad_of, ratio_batch

from thinkrl.methods import get_method, method_class


def test_positive_advantage_clips_each_token_above_then_takes_the_geometric_mean():
    # A = +1, d = (0.6, -0.2): the upper side clips token 0 to 0.4; mean log ratio (0.4 - 0.2) / 2 = 0.1;
    # s = e^0.1 = 1.105171, loss = -1.105171. Gradient: token 0 clipped -> 0; token 1: -A s / 2 = -0.552585
    logp, batch = ratio_batch([[0.6, -0.2]], [1.0])
    loss, grad, metrics = grad_of(get_method("gmpo"), logp, batch)
    assert loss.item() == pytest.approx(-math.exp(0.1))
    assert grad.flatten().tolist() == pytest.approx([0.0, -math.exp(0.1) / 2])
    assert metrics["clip/frac"].item() == 0.5 and metrics["clip/high_frac"].item() == 0.5


def test_negative_advantage_clips_below_only():
    # A = -1, d = (0.6, -0.7): the lower side clips token 1 to -0.4, token 0 (0.6) stays: mean 0.1, s = e^0.1;
    # loss = +1.105171; gradient: token 0 -A s / 2 = +0.552585, token 1 clipped -> 0
    logp, batch = ratio_batch([[0.6, -0.7]], [-1.0])
    loss, grad, metrics = grad_of(get_method("gmpo"), logp, batch)
    assert loss.item() == pytest.approx(math.exp(0.1))
    assert grad.flatten().tolist() == pytest.approx([math.exp(0.1) / 2, 0.0])
    assert metrics["clip/low_frac"].item() == 0.5


def test_sequences_are_averaged_over_their_own_lengths():
    # sequence 0: A = 2, d = (0.1, 0.3, -0.1): nothing clipped, mean 0.1, l = -2 e^0.1 = -2.210342;
    # sequence 1: A = -1, one valid token d = 0.2 (padding 5.0 ignored): l = e^0.2 = 1.221403.
    # loss = (-2.210342 + 1.221403) / 2 = -0.494470; gradients: -2 e^0.1 / (3 x 2) each, e^0.2 / 2, 0
    logp, batch = ratio_batch([[0.1, 0.3, -0.1], [0.2, 5.0, 5.0]], [[2.0] * 3, [-1.0] * 3], mask=[[1, 1, 1], [1, 0, 0]])
    loss, grad, _ = grad_of(get_method("gmpo"), logp, batch)
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) + math.exp(0.2)) / 2)
    g0 = -2 * math.exp(0.1) / 6
    assert grad.flatten().tolist() == pytest.approx([g0, g0, g0, math.exp(0.2) / 2, 0.0, 0.0])


def test_on_policy_it_is_reinforce_with_seq_mean_token_mean():
    logp, batch = ratio_batch([[0.0, 0.0]], [1.0])
    _, grad, _ = grad_of(get_method("gmpo"), logp, batch)
    assert grad.flatten().tolist() == pytest.approx([-0.5, -0.5])


def test_gmpo_help_names_its_paper():
    assert "arXiv 2507.20673" in method_class("gmpo").help()
