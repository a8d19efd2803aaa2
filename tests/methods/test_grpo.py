"""GRPO against the hand-worked cases in docs/methods.md, grpo (aggregation is in test_common.py)."""

import math

import pytest
import torch
from batches import ratio_batch

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method


def one_token(ratio: float, adv: float):
    """A 1x1 batch with log-ratio log(ratio) over old_logp = 0; logp carries grad."""
    return ratio_batch([[math.log(ratio)]], [adv], old=0.0)


def test_ratio_above_clip_with_positive_advantage_is_clipped_and_has_no_gradient():
    # r = 1.5, A = +1, eps = 0.2: l = max(-1.5, -1.2) = -1.2, clipped branch -> d l / d logp = 0
    logp, batch = one_token(1.5, 1.0)
    loss, metrics = get_method("grpo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2)
    assert logp.grad.item() == 0.0
    assert metrics["clip/frac"].item() == 1.0 and metrics["clip/high_frac"].item() == 1.0


def test_ratio_below_clip_with_negative_advantage_is_clipped():
    # r = 0.5, A = -1: l = max(0.5, 0.8) = 0.8, gradient 0
    logp, batch = one_token(0.5, -1.0)
    loss, metrics = get_method("grpo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(0.8)
    assert logp.grad.item() == 0.0
    assert metrics["clip/low_frac"].item() == 1.0


def test_dual_clip_caps_negative_advantage_loss():
    # r = 5, A = -1: l = max(5, 1.2) = 5 without dual clip; with c = 3 it is capped at 3, gradient 0
    logp, batch = one_token(5.0, -1.0)
    loss, _ = get_method("grpo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(5.0)
    assert logp.grad.item() == pytest.approx(5.0)  # d(-r A)/d logp = -A r = 5
    logp, batch = one_token(5.0, -1.0)
    loss, metrics = get_method("grpo", dual_clip=3.0).loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(3.0)
    assert logp.grad.item() == 0.0
    assert metrics["clip/dual_frac"].item() == 1.0


def test_on_policy_loss_is_zero_but_gradient_is_not():
    # all r = 1, beta = 0: per-token loss = -A; with seq-mean-token-mean over one group sum(A) = 0 -> loss 0,
    # gradient = -(1/G) sum_i A_i / T_i  at each token of sequence i
    adv = torch.tensor([1.0, -1.0])
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    batch = TokenBatch(logp=logp, old_logp=torch.zeros(2, 3), behav_logp=torch.zeros(2, 3), advantages=adv, mask=mask)
    loss, _ = get_method("grpo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    expected = torch.tensor([[-1 / 2 / 2, -1 / 2 / 2, 0], [1 / 2 / 3, 1 / 2 / 3, 1 / 2 / 3]])
    assert torch.allclose(logp.grad, expected)


def test_k3_kl_term():
    # pi = ref -> KL 0; log(ref/pi) = 0.5 -> k3 = e^0.5 - 0.5 - 1 = 0.148721
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[0.0, 0.5]])
    batch = TokenBatch(
        logp=logp, old_logp=torch.zeros(1, 2), behav_logp=torch.zeros(1, 2), advantages=torch.zeros(1), mask=torch.ones(1, 2), ref_logp=ref
    )
    m = get_method("grpo", beta=0.1, aggregation="token-mean")
    assert m.requires == {"ref_logp"}
    loss, metrics = m.loss(batch)
    assert loss.item() == pytest.approx(0.1 * (math.exp(0.5) - 1.5) / 2, rel=1e-5)
    assert metrics["kl/ref"].item() == pytest.approx((math.exp(0.5) - 1.5) / 2, rel=1e-5)


def test_grpo_config_is_validated():
    with pytest.raises(UserError, match="clip_hihg.*did you mean clip_high"):
        get_method("grpo", clip_hihg=0.3)
    with pytest.raises(UserError, match="method.clip_high: expected float"):
        get_method("grpo", clip_high="wide")
    with pytest.raises(UserError, match="dual_clip must be > 1"):
        get_method("grpo", dual_clip=0.5)
    with pytest.raises(UserError, match="not one of"):
        get_method("grpo", aggregation="mean")


def test_k3_kl_gradient_is_the_analytic_one():
    # k3 = e^d - d - 1 with d = log ref - log pi: d k3 / d log pi = 1 - e^d = 1 - ref / pi. A = 0 leaves the KL
    # alone; token-mean over 4 tokens, beta 0.1: gradient 0.1 (1 - e^d) / 4, loss 0.1 mean(k3)
    d = torch.tensor([[0.0, 0.5, -1.0, 2.0]])
    logp = torch.full((1, 4), -1.0, requires_grad=True)
    batch = TokenBatch(
        logp=logp, old_logp=logp.detach(), behav_logp=logp.detach(), advantages=torch.zeros(1), mask=torch.ones(1, 4), ref_logp=-1.0 + d
    )
    loss, _ = get_method("grpo", beta=0.1, aggregation="token-mean").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(0.1 * sum(math.exp(x) - x - 1 for x in d[0].tolist()) / 4, rel=1e-6)
    assert torch.allclose(logp.grad, 0.1 * (1 - d.exp()) / 4, atol=1e-7)
    assert logp.grad[0, 1].item() == pytest.approx(0.1 * (1 - math.exp(0.5)) / 4)  # -0.0162180


# pi = 0.5 at both tokens, pi_old = pi (r = 1), A = +1, token-mean, beta 0.1. Token 0: log(ref / pi) = 0.5, so
# k3 = e^0.5 - 1.5 = 0.1487213 and d k3 / d log pi = 1 - e^0.5 = -0.6487213; token 1: ref = pi, no KL.
# mu = 0.2 and 1.0: rho = pi_old / mu = 2.5 and 0.5, so TIS (c_max 2) weighs [2, 0.5], MIS ([0, 2]) [0, 0.5].
# The policy term -A r is weighted, the KL term never:
#   off: loss = (-1 + 0.1 k3 - 1) / 2 = -0.9925639   grad [(-1 - 0.0648721) / 2, -0.5] = [-0.5324361, -0.5]
#   tis: loss = (-2 + 0.1 k3 - 0.5) / 2 = -1.2425639  grad [(-2 - 0.0648721) / 2, -0.25] = [-1.0324361, -0.25]
#   mis: loss = (0 + 0.1 k3 - 0.5) / 2 = -0.2425639   grad [-0.0324361, -0.25]: the dropped token keeps its KL
KL_CASES = [("none", -0.9925639, [-0.5324361, -0.5]), ("tis", -1.2425639, [-1.0324361, -0.25]), ("mis", -0.2425639, [-0.0324361, -0.25])]


def kl_batch(mode: str):
    """The two-token case above, with the trainer's correction weights for `mode`."""
    from thinkrl.config.learner import CorrectionConfig
    from thinkrl.learner.correction import weights

    logp = torch.full((1, 2), math.log(0.5), requires_grad=True)
    old, behav, mask = logp.detach(), torch.tensor([[0.2, 1.0]]).log(), torch.ones(1, 2, dtype=torch.bool)
    ref = torch.tensor([[math.log(0.5) + 0.5, math.log(0.5)]])
    w = weights(old, behav, mask, CorrectionConfig(mode=mode, c_max=2.0))
    return logp, TokenBatch(logp=logp, old_logp=old, behav_logp=behav, advantages=torch.ones(1), mask=mask, ref_logp=ref, is_weights=w)


@pytest.mark.parametrize("mode, want_loss, want_grad", KL_CASES)
def test_correction_weights_the_policy_term_but_not_the_kl(mode, want_loss, want_grad):
    logp, batch = kl_batch(mode)
    loss, metrics = get_method("grpo", beta=0.1, aggregation="token-mean").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(want_loss, abs=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([want_grad]), atol=1e-6)
    assert metrics["kl/ref"].item() == pytest.approx((math.exp(0.5) - 1.5) / 2, rel=1e-5)
