"""DPPO, 20-Entropy (80/20), STAPO and CPPO against the hand-worked cases of methods.md 2.8-2.11."""

import math

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method
from thinkrl.methods.cppo import Config as CPPOConfig
from thinkrl.methods.cppo import thresholds
from thinkrl.ops import masked_quantile, valid_positions


def probs_batch(pi, mu, adv, mask=None, entropy=None, old=None):
    """A batch from probabilities: logp = log pi (a leaf with grad), behav_logp = log mu, old_logp = log old or log mu."""
    logp = torch.tensor(pi, dtype=torch.float32).log().requires_grad_()
    behav = torch.tensor(mu, dtype=torch.float32).log()
    old_logp = behav.clone() if old is None else torch.tensor(old, dtype=torch.float32).log()
    mask = torch.ones_like(behav) if mask is None else torch.tensor(mask)
    ent = None if entropy is None else torch.tensor(entropy, dtype=torch.float32)
    batch = TokenBatch(
        logp=logp, old_logp=old_logp, behav_logp=behav, advantages=torch.tensor(adv, dtype=torch.float32), mask=mask, entropy=ent
    )
    return logp, batch


def grad_of(method, logp, batch):
    loss, metrics = method.loss(batch)
    loss.backward()
    return loss.detach(), logp.grad.clone(), metrics


def random_batch(seed=0, B=4, T=6, entropy=True):
    """Off-policy batch with pi >= e^-3 = 0.0498 > tau_p everywhere and ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
    behav = (old + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 2:] = False
    ent = torch.rand(B, T, generator=g) * 2 if entropy else None
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])[:B]
    return logp, TokenBatch(logp=logp, old_logp=old, behav_logp=behav, advantages=adv, mask=mask, entropy=ent)


# ---------------------------------------------------------------- shared helpers


def test_masked_quantile_is_torch_quantile_linear():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(5, 9, generator=g)
    mask = torch.rand(5, 9, generator=g) > 0.3
    for q in (0.0, 0.05, 0.5, 0.8, 0.9, 1.0):
        assert torch.equal(masked_quantile(x, mask, q), torch.quantile(x[mask], q))
        rows = masked_quantile(x, mask, q, dim=-1)
        for i in range(5):
            assert torch.equal(rows[i], torch.quantile(x[i][mask[i]], q))
    assert masked_quantile(x, torch.zeros_like(mask), 0.5).item() == 0.0  # empty selection -> 0


def test_valid_positions_skip_masked_tokens():
    mask = torch.tensor([[1, 1, 0, 1, 0, 1]]).bool()
    assert valid_positions(mask).tolist() == [[1, 2, 2, 3, 3, 4]]


# ---------------------------------------------------------------- DPPO (methods.md 2.8)


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


# ---------------------------------------------------------------- 20-Entropy / 80-20 (methods.md 2.9)

ENTROPIES = [0.05, 0.9, 0.1, 2.0, 0.3, 0.02, 1.5, 0.2, 0.01, 0.4]


def test_entropy_fork_keeps_the_top_20_percent():
    # sorted: 0.01 0.02 0.05 0.1 0.2 0.3 0.4 0.9 1.5 2.0; rank 0.8 * 9 = 7.2 -> 0.9 + 0.2 (1.5 - 0.9) = 1.02
    # kept: H = 2.0 (index 3) and H = 1.5 (index 6). On-policy r = 1, A = +1: l = -1 on those two tokens,
    # token-mean over all 10 tokens -> loss -0.2, gradient -1/10 there and 0 elsewhere
    logp, batch = probs_batch([[0.5] * 10], [[0.5] * 10], [1.0], entropy=[ENTROPIES])
    m = get_method("entropy_fork")
    assert m.requires == {"entropy"}
    loss, grad, metrics = grad_of(m, logp, batch)
    assert metrics["entropy/threshold"].item() == pytest.approx(1.02, abs=1e-6)
    assert metrics["select/frac"].item() == pytest.approx(0.2)
    assert loss.item() == pytest.approx(-0.2)
    expected = torch.zeros(1, 10)
    expected[0, 3] = expected[0, 6] = -0.1
    assert torch.allclose(grad, expected)


def test_entropy_fork_quantile_ignores_padding():
    # the same ten tokens spread over two rows with padding in between: same threshold, same two tokens
    ent = [ENTROPIES[:6] + [9.0, 9.0], ENTROPIES[6:] + [9.0] * 4]
    mask = [[1] * 6 + [0, 0], [1] * 4 + [0] * 4]
    logp, batch = probs_batch([[0.5] * 8] * 2, [[0.5] * 8] * 2, [1.0, 1.0], mask=mask, entropy=ent)
    _, grad, metrics = grad_of(get_method("entropy_fork"), logp, batch)
    assert metrics["entropy/threshold"].item() == pytest.approx(1.02, abs=1e-6)
    assert (grad != 0).nonzero().tolist() == [[0, 3], [1, 0]]


def test_entropy_fork_with_rho_1_is_dapo():
    logp, batch = random_batch()
    loss, grad, _ = grad_of(get_method("entropy_fork", rho=1.0), logp, batch)
    logp2, batch2 = random_batch()
    dapo_loss, dapo_grad, _ = grad_of(get_method("grpo", clip_high=0.28, aggregation="token-mean"), logp2, batch2)
    assert torch.equal(loss, dapo_loss) and torch.equal(grad, dapo_grad)


def test_entropy_fork_config_is_validated():
    with pytest.raises(UserError, match="rho must be in"):
        get_method("entropy_fork", rho=0.0)


# ---------------------------------------------------------------- STAPO (methods.md 2.10)


def test_stapo_silences_positive_low_prob_low_entropy_token_only():
    # two rows of 12 tokens, on-policy (r = 1). Token 0 of each row: pi = 0.005 < tau_p = 0.01, H = 0.01.
    # 24 entropies sorted: 0.01 0.01 1.0 1.0 ...; rank 0.05 * 23 = 1.15 -> tau_h = 0.01 + 0.15 (1.0 - 0.01) = 0.1585
    # row 0 has A = +1 -> its token 0 is silenced; row 1 has A = -1 -> kept.
    # loss = (11 (-1) + 12 (+1)) / (24 - 1) = 1/23; gradient -A r / 23: row 0 -1/23 (token 0: 0), row 1 +1/23
    pi = [[0.005] + [0.5] * 11] * 2
    ent = [[0.01] + [1.0 + 0.1 * k for k in range(11)]] * 2
    logp, batch = probs_batch(pi, pi, [1.0, -1.0], entropy=ent, old=pi)
    m = get_method("stapo")
    assert m.requires == {"entropy"}
    loss, grad, metrics = grad_of(m, logp, batch)
    assert metrics["entropy/threshold"].item() == pytest.approx(0.1585, abs=1e-6)
    assert metrics["silenced/frac"].item() == pytest.approx(1 / 24)
    assert loss.item() == pytest.approx(1 / 23)
    expected = torch.tensor([[0.0] + [-1 / 23] * 11, [1 / 23] * 12])
    assert torch.allclose(grad, expected)


def test_stapo_needs_all_three_criteria():
    # same rows, but token 0 of row 0 has pi = 0.05 >= tau_p: nothing silenced -> token-mean over 24
    pi = [[0.05] + [0.5] * 11, [0.005] + [0.5] * 11]
    ent = [[0.01] + [1.0 + 0.1 * k for k in range(11)]] * 2
    logp, batch = probs_batch(pi, pi, [1.0, -1.0], entropy=ent, old=pi)
    loss, _, metrics = grad_of(get_method("stapo"), logp, batch)
    assert metrics["silenced/frac"].item() == 0.0
    assert loss.item() == pytest.approx(0.0, abs=1e-7)  # (12 (-1) + 12 (+1)) / 24
    # an entropy at or above tau_h protects it too: row 0 token 0 with H = 1.5 (pi = 0.005, A = +1).
    # sorted: 0.01 1.0 1.0 1.1 ...; rank 1.15 -> tau_h = 1.0 + 0.15 (1.0 - 1.0) = 1.0 <= 1.5 -> not silenced
    pi = [[0.005] + [0.5] * 11] * 2
    ent = [[1.5] + [1.0 + 0.1 * k for k in range(11)], [0.01] + [1.0 + 0.1 * k for k in range(11)]]
    logp, batch = probs_batch(pi, pi, [1.0, -1.0], entropy=ent, old=pi)
    _, _, metrics = grad_of(get_method("stapo"), logp, batch)
    assert metrics["silenced/frac"].item() == 0.0
    assert metrics["entropy/threshold"].item() == pytest.approx(1.0, abs=1e-6)


def test_stapo_without_spurious_tokens_is_grpo_token_mean():
    logp, batch = random_batch()  # pi >= 0.0498 > tau_p: no token can be silenced
    loss, grad, metrics = grad_of(get_method("stapo"), logp, batch)
    assert metrics["silenced/frac"].item() == 0.0
    logp2, batch2 = random_batch()
    ref_loss, ref_grad, _ = grad_of(get_method("grpo", aggregation="token-mean"), logp2, batch2)
    assert torch.allclose(loss, ref_loss, atol=1e-7) and torch.allclose(grad, ref_grad, atol=1e-7)


def test_stapo_config_is_validated():
    with pytest.raises(UserError, match="tau_p must be in"):
        get_method("stapo", tau_p=0.0)
    with pytest.raises(UserError, match="entropy_quantile must be in"):
        get_method("stapo", entropy_quantile=1.5)


# ---------------------------------------------------------------- CPPO (methods.md 2.11)

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
