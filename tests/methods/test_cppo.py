"""CPPO against the hand-worked cases in docs/methods.md, cppo."""

import pytest
import torch
from batches import grad_of, probs_batch, random_batch
from helpers import assert_second_correction_refused_unless_anchor_old

from thinkrl.errors import UserError
from thinkrl.methods import get_method
from thinkrl.methods.cppo import Config as CPPOConfig
from thinkrl.methods.cppo import thresholds

CPPO_PI = [0.65, 0.65, 0.65, 0.35, 0.65]


def test_cppo_worked_example():
    # mu = 0.5 at all 5 positions, A = +1, delta = 0.2 (the example's delta; DPPO with 0.2 would keep tokens 1-3, 5)
    # D = 0.15 everywhere; w = [1, .95, .9, .85, .8]; Z = [.15, .1425, .135, .1275, .12]
    # budget = clip(P90 = 0.15, 0.02, 0.04) = 0.04; W_{t-1} = [0, 1, 1.95, 2.85, 3.7]; S_{t-1} = [0, .15, .2925, .4275, .555]
    # c = min(0.2, 0.2 + 0.04 W - S) = [0.2, 0.09, -0.0145, -0.1135, -0.207]
    # keep: Z <= c -> [T, F, F, F, F]; token 4 moves toward mu (A (r - 1) = -0.3 <= 0) -> keep = [T, F, F, T, F]
    cfg = CPPOConfig(delta=0.2)
    z, c = thresholds(torch.full((1, 5), 0.15), torch.ones(1, 5, dtype=torch.bool), cfg)
    assert torch.allclose(z, torch.tensor([[0.15, 0.1425, 0.135, 0.1275, 0.12]]), atol=1e-6)
    assert torch.allclose(c, torch.tensor([[0.2, 0.09, -0.0145, -0.1135, -0.207]]), atol=1e-6)
    # loss -A r keep, token-mean over 5: gradient -A r / 5 on kept tokens: r = 1.3 -> -0.26, r = 0.7 -> -0.14
    logp, batch = probs_batch([CPPO_PI], [[0.5] * 5], [1.0])
    _, grad, metrics = grad_of(get_method("cppo", delta=0.2), logp, batch)
    assert torch.allclose(grad, torch.tensor([[-0.26, 0.0, 0.0, -0.14, 0.0]]), atol=1e-6)
    assert metrics["mask/frac"].item() == pytest.approx(3 / 5)
    assert metrics["mask/budget_frac"].item() == pytest.approx(3 / 5)  # all three have Z <= delta = 0.2


def test_cppo_positions_count_valid_tokens_only():
    # the worked example with padding inside the row and a second, unrelated sequence: same keep pattern
    mask = [[1, 1, 0, 1, 1, 0, 1], [1, 1, 1, 0, 0, 0, 0]]
    pi = [[0.65, 0.65, 0.9, 0.65, 0.35, 0.9, 0.65], [0.4, 0.4, 0.4, 0.5, 0.5, 0.5, 0.5]]
    logp, batch = probs_batch(pi, [[0.5] * 7] * 2, [1.0, -1.0], mask=mask)
    _, grad, _ = grad_of(get_method("cppo", delta=0.2), logp, batch)
    n = 8  # valid tokens (token-mean)
    assert torch.allclose(grad[0], torch.tensor([-1.3 / n, 0, 0, 0, -0.7 / n, 0, 0]), atol=1e-6)
    # row 1 (T = 3), A = -1, pi = 0.4 falls away from mu (A (r - 1) = 0.2 > 0), so only the budget decides.
    # D = 0.1: w = [1, .9, .8], Z = [.1, .09, .08]; budget = clip(0.1, .02, .04) = .04
    # c = [0.2, 0.2 + 0.04 * 1 - 0.1 = 0.14, 0.2 + 0.04 * 1.9 - 0.19 = 0.086] -> Z <= c everywhere, all kept
    # gradient -A r / n = 0.8 / 8
    assert torch.allclose(grad[1], torch.tensor([0.8 / n] * 3 + [0.0] * 4), atol=1e-6)


def test_cppo_single_token_sequence():
    # T = 1: w_1 = 1, c_1 = delta = 0.15; D = 0.1 -> kept (gradient -r = -1.2), D = 0.2 -> masked
    for pi, expected in ((0.6, -1.2), (0.7, 0.0)):
        logp, batch = probs_batch([[pi]], [[0.5]], [1.0])
        _, grad, _ = grad_of(get_method("cppo"), logp, batch)
        assert torch.isfinite(grad).all() and grad.item() == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_cppo_wide_delta_reduces_to_is_gradient():
    # delta larger than any possible S_{t-1} (<= T) keeps every token: gradient of token-mean(-A r)
    logp, batch = random_batch()
    _, grad, metrics = grad_of(get_method("cppo", delta=100.0), logp, batch)
    assert metrics["mask/frac"].item() == 0.0
    r = torch.exp(logp.detach() - batch.behav_logp)
    assert torch.allclose(grad, -batch.advantages * r * batch.mask / batch.num_tokens, atol=1e-7)


def test_cppo_config_is_validated():
    with pytest.raises(UserError, match="w_min must be in"):
        get_method("cppo", w_min=0.0)
    with pytest.raises(UserError, match="delta must be > 0"):
        get_method("cppo", delta=-1.0)


@pytest.mark.parametrize("mode", ["tis", "mis", "icepop", "ipo"])
def test_cppo_refuses_a_second_rollout_correction_unless_anchored_at_pi_old(mode):
    assert_second_correction_refused_unless_anchor_old("cppo", mode)
