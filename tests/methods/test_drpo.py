"""DRPO against the hand-worked sanity cases in docs/methods.md, drpo."""

import math

import pytest
import torch
from batches import CONFIGS, grad_of, probs_batch, random_batch
from helpers import assert_second_correction_refused_unless_anchor_old

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.settings import load_config, resolve_with_method


def point(pi, mu, adv):
    """A float64 single-token batch from probabilities: (logp leaf, batch), pi_old = mu."""
    return probs_batch([[pi]], [[mu]], [adv], dtype=torch.float64)


@pytest.mark.parametrize(
    "pi, mu, adv, delta, w, grad",
    [
        (0.5, 0.5, 1.0, 0.2, 1.0, -1.0),  # r = 1: penalty and its gradient 0, l = -A, grad -A
        (0.6, 0.5, 1.0, 0.2, 0.5, -0.6),  # r = 1.2, w = 1 - 0.1 / 0.2 = 0.5: -A r w = -0.6 (diverging, shrunk)
        (0.6, 0.5, 1.0, 12.5, 0.992, -1.1904),  # w = 1 - 0.1 / 12.5 = 0.992: -1.2 * 0.992 = -1.1904
        (0.4, 0.5, 1.0, 0.2, 1.5, -1.2),  # r = 0.8, A (r - 1) < 0: w = 1 + 0.1 / 0.2 = 1.5: -0.8 * 1.5 = -1.2 (converging, amplified)
        (0.75, 0.5, 1.0, 0.2, -0.25, 0.375),  # r = 1.5, w = 1 - 0.25 / 0.2 = -0.25: -1.5 * -0.25 = +0.375 (corrective)
        (0.3, 0.5, -1.0, 0.2, 0.0, 0.0),  # r = 0.6, A (r - 1) = 0.4 > 0: w = 1 - 0.2 / 0.2 = 0 (exact boundary)
    ],
)
def test_drpo_gradient_matches_finite_difference_and_closed_form(pi, mu, adv, delta, w, grad):
    m = get_method("drpo", delta=delta)
    logp, batch = point(pi, mu, adv)
    loss, metrics = m.loss(batch)
    loss.backward()
    # loss value: -A r + |A| / (2 delta) mu (r - 1)^2
    r = pi / mu
    assert loss.item() == pytest.approx(-adv * r + abs(adv) / (2 * delta) * mu * (r - 1) ** 2, abs=1e-12)
    # autograd == closed form -A r w == the listed value
    assert logp.grad.item() == pytest.approx(-adv * r * w, abs=1e-12)
    assert logp.grad.item() == pytest.approx(grad, abs=1e-12)
    assert metrics["weight/mean"].item() == pytest.approx(w, abs=1e-6)  # metrics are float32
    # autograd == central finite difference of the loss in log pi (h = 1e-6, float64: error ~ h^2)
    h = 1e-6
    up = m.loss(point(math.exp(math.log(pi) + h), mu, adv)[1])[0].item()
    down = m.loss(point(math.exp(math.log(pi) - h), mu, adv)[1])[0].item()
    assert logp.grad.item() == pytest.approx((up - down) / (2 * h), abs=1e-8)


def test_drpo_on_policy_is_minus_A_and_metrics():
    # r = 1 everywhere: penalty 0, weight 1, l = -A; token-mean of -A over the ragged batch
    logp, batch = random_batch(on_policy=True)
    loss, grad, metrics = grad_of(get_method("drpo"), logp, batch)
    assert loss.item() == pytest.approx(-(batch.advantages * batch.mask).sum().item() / batch.num_tokens, abs=1e-6)
    assert torch.allclose(grad, -batch.advantages * batch.mask / batch.num_tokens, atol=1e-7)
    assert metrics["penalty/mean"].item() == 0.0 and metrics["weight/mean"].item() == 1.0
    assert metrics["ratio/mean"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("delta", [1e12, math.inf])
def test_drpo_infinite_delta_is_the_is_surrogate(delta):
    # delta -> infinity: the penalty vanishes, l = -A r with r = pi / mu: gradient -A r / N
    logp, batch = random_batch()
    loss, grad, metrics = grad_of(get_method("drpo", delta=delta), logp, batch)
    r = torch.exp(logp.detach() - batch.behav_logp) * batch.mask
    assert loss.item() == pytest.approx((-batch.advantages * r).sum().item() / batch.num_tokens, abs=1e-6)
    assert torch.allclose(grad, -batch.advantages * r / batch.num_tokens, atol=1e-7)
    assert metrics["weight/mean"].item() == pytest.approx(1.0)


def test_drpo_weight_stays_in_the_bounded_band():
    # |pi - mu| <= 1 -> w in [1 - 1/delta, 1 + 1/delta] = [0.92, 1.08] at delta 12.5; check on a random batch
    # against the closed form (gradient / (-A r / N)) token by token
    logp, batch = random_batch(seed=3)
    _, grad, _ = grad_of(get_method("drpo"), logp, batch)
    r = torch.exp(logp.detach() - batch.behav_logp)
    w = (grad * batch.num_tokens / (-batch.advantages * r))[batch.mask]
    shift = (logp.detach().exp() - batch.behav_logp.exp())[batch.mask]
    assert torch.allclose(w, 1 - torch.sign(batch.advantages[batch.mask]) * shift / 12.5, atol=1e-5)
    assert ((w >= 0.92 - 1e-6) & (w <= 1.08 + 1e-6)).all()


def test_drpo_anchor_old_and_norm_length():
    # anchor=old: mu is pi_old = 0.5 although the sampler's mu is 0.2; pi = 0.6, A = +1, delta 0.2 -> -0.6
    logp = torch.tensor([[math.log(0.6)]], requires_grad=True)
    batch = TokenBatch(
        logp=logp,
        old_logp=torch.tensor([[math.log(0.5)]]),
        behav_logp=torch.tensor([[math.log(0.2)]]),
        advantages=torch.tensor([1.0]),
        mask=torch.ones(1, 1),
    )
    _, grad, _ = grad_of(get_method("drpo", delta=0.2, anchor="old"), logp, batch)
    assert grad.item() == pytest.approx(-0.6, rel=1e-5)
    # seq-mean-token-sum-norm with L = 4: on-policy rows of 2 and 4 tokens, A = [1, -1]:
    # sum l = 2 (-1) + 4 (+1) = 2 -> 2 / (N L) = 2 / (2 * 4) = 0.25
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    batch = TokenBatch(
        logp=logp,
        old_logp=logp.detach(),
        behav_logp=logp.detach(),
        advantages=torch.tensor([1.0, -1.0]),
        mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]),
    )
    loss, _ = get_method("drpo", aggregation="seq-mean-token-sum-norm", norm_length=4).loss(batch)
    assert loss.item() == pytest.approx(0.25)


def test_drpo_config_is_validated():
    with pytest.raises(UserError, match=r"delta must be > 0.*got 0.0"):
        get_method("drpo", delta=0.0)
    with pytest.raises(UserError, match=r"delta must be > 0.*got nan"):
        get_method("drpo", delta=float("nan"))
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method("drpo", norm_length=-1)
    with pytest.raises(UserError, match="not one of"):
        get_method("drpo", anchor="ref")


def test_drpo_config_file_resolves():
    cfg, method = resolve_with_method(load_config(CONFIGS / "drpo.yaml"))
    assert cfg.method.params["aggregation"] == "seq-mean-token-sum-norm"
    assert method.cfg.norm_length == 48  # 0 -> rollout.max_new_tokens
    assert cfg.method.params["delta"] == 12.5 and cfg.method.params["anchor"] == "behav"


def test_drpo_advantage_estimator_and_help():
    cls = method_class("drpo")
    assert cls.advantage == "no_std"
    text = cls.help()
    assert "arXiv 2606.09821" in text and "Relative to grpo" in text and "Confidence" in text


@pytest.mark.parametrize("mode", ["tis", "mis", "icepop", "ipo"])
def test_drpo_refuses_a_second_rollout_correction_unless_anchored_at_pi_old(mode):
    assert_second_correction_refused_unless_anchor_old("drpo", mode)
