"""Thinking Seeds' loss against the hand-worked case in docs/methods.md, thinking_seeds (the pool, seeded rollouts and resume are
tests/test_seeds.py)."""

import math

import pytest
import torch
from batches import grad_of, logp_batch

from thinkrl.methods import get_method


def batch_with_prefix(prefix, logp_theta, logp_old, logp_behav, adv, mask=None):
    """logp_batch with Thinking Seeds' prefix_mask first; logp_theta is a leaf with grad."""
    return logp_batch(logp_theta, adv, mask, old=logp_old, behav=logp_behav, prefix=prefix)


def random_prefix_lists(prefix_rows, seed=0):
    """(theta, old, behav, prefix) as 3 x 5 lists: pi_old and mu differ from pi; row i has a prefix of prefix_rows[i] tokens."""
    g = torch.Generator().manual_seed(seed)
    theta = (-torch.rand(3, 5, generator=g) * 2 - 0.1).tolist()
    old = (torch.tensor(theta) + 0.2 * torch.randn(3, 5, generator=g)).tolist()
    behav = (torch.tensor(theta) + 0.5 * torch.randn(3, 5, generator=g)).tolist()
    prefix = [[j < prefix_rows[i] for j in range(5)] for i in range(3)]
    return theta, old, behav, prefix


@pytest.mark.parametrize("host", ["dapo", "grpo"])
def test_no_prefix_is_exactly_the_host_loss(host):
    theta, old, behav, prefix = random_prefix_lists([0, 0, 0])
    logp, batch = batch_with_prefix(prefix, theta, old, behav, [1.0, -0.5, 0.3])
    got = grad_of(get_method("thinking_seeds", host=host), logp, batch)
    logp2, batch2 = batch_with_prefix(prefix, theta, old, behav, [1.0, -0.5, 0.3])
    host_method = get_method("dapo") if host == "dapo" else get_method("grpo", aggregation="token-mean")
    want = grad_of(host_method, logp2, batch2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_historical_policy_equal_to_pi_old_is_on_policy():
    # prefix tokens anchored at pi_h = pi_old: the same loss and gradient as with no prefix at all
    theta, old, _, prefix = random_prefix_lists([2, 5, 0])
    logp, batch = batch_with_prefix(prefix, theta, old, old, [1.0, -0.5, 0.3])
    got = grad_of(get_method("thinking_seeds"), logp, batch)
    logp2, batch2 = batch_with_prefix([[False] * 5] * 3, theta, old, old, [1.0, -0.5, 0.3])
    want = grad_of(get_method("thinking_seeds"), logp2, batch2)
    assert torch.allclose(got[0], want[0]) and torch.allclose(got[1], want[1])


def test_prefix_token_ratio_against_the_historical_policy():
    # docs/methods.md, thinking_seeds: pi_theta = 0.3, pi_h = 0.6 -> r = 0.5; A = +1, eps 0.2: max(-0.5, -0.8) = -0.5, unclipped,
    # so d l / d log pi = -r A = -0.5. The continuation token (pi_old = pi_theta) has r = 1: l = -1, grad -1.
    # token-mean over 2 tokens: loss = (-0.5 - 1) / 2, grads [-0.25, -0.5]
    logp, batch = batch_with_prefix(
        [[True, False]], [[math.log(0.3), math.log(0.2)]], [[math.log(0.9), math.log(0.2)]], [[math.log(0.6), math.log(0.7)]], [1.0]
    )
    loss, grad, metrics = grad_of(get_method("thinking_seeds", host="grpo"), logp, batch)
    assert loss.item() == pytest.approx(-0.75)
    assert torch.allclose(grad, torch.tensor([[-0.25, -0.5]]))
    assert metrics["prefix/abs_log_ratio"].item() == pytest.approx(math.log(2))
    assert metrics["cont/abs_log_ratio"].item() == pytest.approx(0.0)


def test_prefix_cap_limits_a_stale_ratio_with_negative_advantage():
    # pi_theta = 0.9, pi_h = 0.1: r = 9, A = -1: uncapped l = 9; capped at 2 -> l = 2 with no gradient
    logp, batch = batch_with_prefix([[True]], [[math.log(0.9)]], [[math.log(0.9)]], [[math.log(0.1)]], [-1.0])
    loss, grad, _ = grad_of(get_method("thinking_seeds"), logp, batch)
    assert loss.item() == pytest.approx(2.0) and grad.item() == 0.0
    logp, batch = batch_with_prefix([[True]], [[math.log(0.9)]], [[math.log(0.9)]], [[math.log(0.1)]], [-1.0])
    loss, grad, _ = grad_of(get_method("thinking_seeds", prefix_cap=0.0), logp, batch)
    assert loss.item() == pytest.approx(9.0) and grad.item() == pytest.approx(9.0)
