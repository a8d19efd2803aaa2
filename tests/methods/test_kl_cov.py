"""KL-Cov against a hand-worked covariance ranking and penalty (docs/methods.md, kl_cov)."""

import math

import pytest
from batches import grad_of, logp_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class

# as in test_clip_cov.py: cov = (1.125, -1.375) for A = +1 and (-0.625, 0.375) for A = -1
LOGP = [[-0.5, -3.0], [-1.0, -2.0]]
ADV = [[1.0, 1.0], [-1.0, -1.0]]


def test_the_top_covariance_token_carries_the_penalty():
    # pi_theta moved: d = log pi - log pi_old = (0.2, 0.1, -0.1, 0.3). Top-1 covariance (computed on log pi):
    # (0, 0). l = -A e^d, plus 1.0 |0.2| on (0, 0):
    # (-e^0.2 + 0.2, -e^0.1, e^-0.1, e^0.3) / 4; gradients -A e^d / 4, plus sign(d) / 4 on (0, 0)
    old = [[-0.7, -3.1], [-0.9, -2.3]]
    logp, batch = logp_batch(LOGP, ADV, old=old)
    loss, grad, metrics = grad_of(get_method("kl_cov"), logp, batch)
    want = (-math.exp(0.2) + 0.2 - math.exp(0.1) + math.exp(-0.1) + math.exp(0.3)) / 4
    assert loss.item() == pytest.approx(want)
    assert grad.flatten().tolist() == pytest.approx([(-math.exp(0.2) + 1) / 4, -math.exp(0.1) / 4, math.exp(-0.1) / 4, math.exp(0.3) / 4])
    assert metrics["cov/frac"].item() == 0.25


def test_no_clip_and_on_policy_the_penalty_has_no_gradient():
    # r = 1 everywhere: |d| = 0 has gradient 0, so the gradient is REINFORCE's, -A / 4 per token
    logp, batch = logp_batch(LOGP, ADV)
    _, grad, _ = grad_of(get_method("kl_cov", kl_ratio=0.5), logp, batch)
    assert grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.25, 0.25])
    # far off-policy, A = +1, r = e^2: no clip, the gradient is -r / 4 (grpo's would be 0)
    logp, batch = logp_batch(LOGP, ADV, old=[[-0.5, -5.0], [-1.0, -2.0]])
    _, grad, _ = grad_of(get_method("kl_cov"), logp, batch)
    assert grad[0, 1].item() == pytest.approx(-math.exp(2.0) / 4)


def test_kl_cov_help_and_config():
    assert "arXiv 2505.22617" in method_class("kl_cov").help()
    with pytest.raises(UserError, match="kl_coef must be >= 0, got -1.0"):
        get_method("kl_cov", kl_coef=-1.0)
