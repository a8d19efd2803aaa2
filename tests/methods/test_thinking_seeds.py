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


def test_prefix_cap_counts_as_lost_gradient():
    # prefix token: pi_theta = 0.9, pi_h = 0.1 -> r = 9, A = -1: capped at 2, l = max(2, 1.28) = 2 and no gradient;
    # the clip never acts above 1 with A < 0, so only the cap removed it. Continuation token: r = 1, l = 1,
    # gradient -A r / 2 = 0.5. Half the tokens lost their gradient: clip/frac 0.5, all of it on the prefix.
    args = ([[True, False]], [[math.log(0.9), math.log(0.2)]], [[math.log(0.9), math.log(0.2)]], [[math.log(0.1), math.log(0.3)]], [-1.0])
    logp, batch = batch_with_prefix(*args)
    loss, grad, m = grad_of(get_method("thinking_seeds"), logp, batch)
    assert loss.item() == pytest.approx(1.5) and torch.allclose(grad, torch.tensor([[0.0, 0.5]]))
    assert m["clip/frac"].item() == 0.5 and m["clip/high_frac"].item() == 0.5 and m["clip/low_frac"].item() == 0.0
    assert m["prefix/clip_frac"].item() == 1.0 and m["prefix/cap_frac"].item() == 1.0 and m["cont/clip_frac"].item() == 0.0
    # without the cap the same token keeps its gradient -A r / 2 = 4.5, and nothing is counted
    logp, batch = batch_with_prefix(*args)
    _, grad, m = grad_of(get_method("thinking_seeds", prefix_cap=0.0), logp, batch)
    assert grad[0, 0].item() == pytest.approx(4.5) and m["clip/frac"].item() == 0.0 and m["prefix/cap_frac"].item() == 0.0


def test_prefix_cap_inside_the_clip_window_is_counted_too():
    # clip_high 1.5 (window up to 2.5) and A = +1: r = 9 is capped at 2, where the clipped and unclipped branches
    # are equal (-2), so the clip does not fire; the cap alone removed the gradient
    logp, batch = batch_with_prefix([[True]], [[math.log(0.9)]], [[math.log(0.9)]], [[math.log(0.1)]], [1.0])
    loss, grad, m = grad_of(get_method("thinking_seeds", host="grpo", clip_high=1.5), logp, batch)
    assert loss.item() == pytest.approx(-2.0) and grad.item() == 0.0
    assert m["clip/frac"].item() == 1.0 and m["prefix/clip_frac"].item() == 1.0 and m["prefix/cap_frac"].item() == 1.0


# One row: a prefix token, then two continuation tokens. pi_old = [0.5, 0.5, 0.4], mu = [0.1, 0.25, 0.5] (mu of
# the prefix token is pi_h), so rho = pi_old / mu = [5, 2, 0.8]. The prefix token is ratioed against pi_h by the
# loss itself: the trainer's weight leaves it at 1 and a sequence's product runs over 2 x 0.8 = 1.6 only.
# Applied to every token (before), TIS would weigh the prefix 2, sequence TIS would use 5 x 2 x 0.8 = 8 -> 2
# everywhere, and MIS would drop the prefix (rho 5 > 2) or, per sequence, the whole row.
@pytest.mark.parametrize(
    "mode, level, c_max, want",
    [
        ("tis", "token", 2.0, [1.0, 2.0, 0.8]),
        ("tis", "token", 0.5, [1.0, 0.5, 0.5]),
        ("mis", "token", 1.5, [1.0, 0.0, 0.8]),
        ("tis", "sequence", 2.0, [1.0, 1.6, 1.6]),
        ("mis", "sequence", 2.0, [1.0, 1.6, 1.6]),
    ],
)
def test_correction_weights_leave_prefix_tokens_alone(mode, level, c_max, want):
    from thinkrl.config.learner import CorrectionConfig
    from thinkrl.learner.correction import weights

    old, behav = torch.tensor([[0.5, 0.5, 0.4]]).log(), torch.tensor([[0.1, 0.25, 0.5]]).log()
    mask, prefix = torch.ones(1, 3, dtype=torch.bool), torch.tensor([[True, False, False]])
    m = get_method("thinking_seeds")
    assert m.mismatch_corrected == "prefix"
    w = weights(old, behav, mask, CorrectionConfig(mode=mode, level=level, c_max=c_max), exempt=prefix)
    assert torch.allclose(w, torch.tensor([want]), atol=1e-6)


def test_thinking_seeds_takes_a_rollout_correction():
    # continuation tokens are ordinary sampled tokens (mu -> pi_old), so tis / mis are accepted, unlike for the
    # methods that correct every token themselves (dppo, cppo, drpo with anchor=behav; ais)
    from thinkrl.settings import load_config, resolve

    cfg = resolve(load_config(overrides=["correction.mode=mis"], **{"method.name": "thinking_seeds"}))
    assert cfg.correction.mode == "mis" and cfg.seeds.enabled
