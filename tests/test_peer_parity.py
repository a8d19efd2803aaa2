"""SAPO, GMPO, Clip-Cov, KL-Cov, IcePop and IPO's mask against the peer code each names, on the same random inputs.

Ratios span the clip and gate regions on both sides, advantages take both signs, rows are padded. Values and
gradients must agree within 1e-6. verl 0.9.1's losses run from its wheel (.peers/, downloaded by `make install`);
prime-rl's IPO loss runs from a checkout named by THINKRL_PRIME_RL (not on PyPI; checked at commit 559b447).
The differences that remain are stated in docs/methods.md and each method's docstring; the hand-worked tests of
each method are in tests/methods/.
"""

from __future__ import annotations

import pytest
import torch
from peer_code import VERL_VERSION, VERL_WHEEL, StandIn, prime_rl_loss, verl_modules

from thinkrl.batch import TokenBatch
from thinkrl.config import CorrectionConfig
from thinkrl.learner.correction import weights
from thinkrl.methods import get_method

FETCH = "make install downloads it (pip download --no-deps verl==0.9.1 -d .peers)"
pytestmark = pytest.mark.skipif(not VERL_WHEEL.exists(), reason=f"no {VERL_WHEEL.name}: {FETCH}")
TOL = 1e-6
LENGTHS = [9, 7, 5, 9, 3, 8]
ADV = [1.2, -0.7, 0.4, -1.5, 0.9, -0.3]


@pytest.fixture(scope="module")
def verl():
    return verl_modules()  # (core_algos, rollout_corr_helper)


def inputs(seed: int, spread: float = 0.35):
    """(logp, old_logp, advantages, mask): 6 ragged rows of 9, log-ratios ~ N(0, spread), padding filled with junk."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(LENGTHS), max(LENGTHS)
    mask = torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]  # (B, T)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = (logp + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    logp, old = torch.where(mask, logp, 7.0), torch.where(mask, old, -9.0)  # junk where nothing is valid
    adv = torch.tensor(ADV, dtype=torch.float64)[:, None].expand(B, T).clone()
    return logp, old, adv, mask


def verl_loss(fn, logp, old, adv, mask, agg, config):
    lp = logp.clone().requires_grad_()
    loss, _ = fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask.double(), loss_agg_mode=agg, config=config)
    loss.backward()
    return loss.detach(), torch.where(mask, lp.grad, 0.0)


def thinkrl_loss(name, params, logp, old, adv, mask, is_weights=None):
    lp = logp.clone().requires_grad_()
    batch = TokenBatch(logp=lp, old_logp=old, behav_logp=old, advantages=adv, mask=mask, is_weights=is_weights)
    loss, metrics = get_method(name, **params).loss(batch)
    loss.backward()
    return loss.detach(), torch.where(mask, lp.grad, 0.0), metrics


def actor(**kw):
    losses = {k: kw.pop(k) for k in list(kw) if k.startswith(("clip_cov", "kl_cov", "ppo_kl"))}
    return StandIn(global_batch_info={}, clip_ratio_c=3.0, policy_loss=StandIn(**losses), **kw)


CASES = {  # thinkrl method and settings; verl loss, its aggregation and its config
    "sapo": ("sapo", {}, "sapo", "seq-mean-token-mean", actor(tau_pos=1.0, tau_neg=1.05)),
    "sapo-taus": ("sapo", {"tau_pos": 2.0, "tau_neg": 3.0}, "sapo", "seq-mean-token-mean", actor(tau_pos=2.0, tau_neg=3.0)),
    "gmpo": ("gmpo", {}, "geo_mean", "token-mean", actor(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4)),
    "gmpo-narrow": (
        "gmpo",
        {"clip_low": 0.1, "clip_high": 0.2},
        "geo_mean",
        "token-mean",
        actor(clip_ratio=0.1, clip_ratio_low=0.1, clip_ratio_high=0.2),
    ),
    # a clip ratio large enough that every candidate is dropped: verl's random draw (torch.randperm) then chooses
    # nothing, so the two agree token for token; with fewer drops than candidates the subsets differ (docs/methods.md)
    "clip_cov": (
        "clip_cov",
        {"clip_ratio": 0.5, "cov_lb": 0.2, "cov_ub": 5.0},
        "clip_cov",
        "token-mean",
        actor(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_ratio=0.5, clip_cov_lb=0.2, clip_cov_ub=5.0),
    ),
    "kl_cov": ("kl_cov", {"kl_ratio": 0.1}, "kl_cov", "token-mean", actor(kl_cov_ratio=0.1, ppo_kl_coef=1.0)),
    "kl_cov-one": ("kl_cov", {"kl_coef": 0.1}, "kl_cov", "token-mean", actor(kl_cov_ratio=2e-4, ppo_kl_coef=0.1)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_and_gradient_equal_verls(verl, case, seed):
    name, params, peer, agg, config = CASES[case]
    logp, old, adv, mask = inputs(seed)
    want, want_grad = verl_loss(verl[0].get_policy_loss_fn(peer), logp, old, adv, mask, agg, config)
    got, got_grad, metrics = thinkrl_loss(name, params, logp, old, adv, mask)
    assert abs(got.item() - want.item()) <= TOL, f"{case} (verl {VERL_VERSION}): loss {got.item()} vs {want.item()}"
    assert (got_grad - want_grad).abs().max().item() <= TOL, f"{case}: gradient differs by {(got_grad - want_grad).abs().max().item()}"
    assert want_grad.abs().max() > 0.01  # a comparison of something
    if name in ("clip_cov", "kl_cov"):
        assert 0 < metrics["cov/frac"].item() < 0.5  # some tokens were selected, not all


def test_the_inputs_reach_the_clip_and_gate_regions():
    logp, old, adv, mask = inputs(0)
    r = (logp - old)[mask].exp()
    assert (r > 1.2).any() and (r < 0.8).any() and (r > 1.5).any() and (r < 0.67).any()  # e^0.4 = 1.49: gmpo's window too
    assert (adv[mask] > 0).any() and (adv[mask] < 0).any() and not mask.all()


@pytest.mark.parametrize("band", [(0.5, 5.0), (0.8, 1.25)])
def test_icepop_weights_equal_verls(verl, band):
    old, behav, _, mask = inputs(3, spread=1.0)  # rho = pi_old / mu far outside the band on both sides
    want, _ = verl[1].compute_rollout_correction_weights(old - behav, mask.double(), "token", f"{band[0]}_{band[1]}")
    got = weights(old, behav, mask, CorrectionConfig(mode="icepop", band=list(band)))
    assert (got - want).abs().max().item() <= TOL
    assert (want[mask] == 0).any() and (want[mask] > 0).any()


@pytest.mark.skipif(prime_rl_loss() is None, reason="THINKRL_PRIME_RL names no prime-rl checkout (not on PyPI)")
@pytest.mark.parametrize("eps", [0.1, 0.02])
def test_ipo_mask_with_grpo_equals_prime_rls_ipo_loss_at_the_first_update(eps):
    # prime-rl: sum_t -[|p_theta - p_mu| <= eps] A exp(log p_theta - log mu), over its token count, KL term off.
    # thinkrl: grpo (r = 1 at the first update, pi_theta = pi_old) weighted by correction.mode=ipo, token-mean
    prime = prime_rl_loss()
    assert prime is not None
    old, behav, adv, mask = inputs(4, spread=0.6)
    rows, settings = [], StandIn(ipo_threshold=eps, adv_tau=1.0, kl_tau=0.0)
    lp = old.clone().requires_grad_()
    for i, n in enumerate(LENGTHS):
        rows.append(prime.ipo_loss_fn(prime.LossInputs(lp[i, :n], behav[i, :n], None, adv[i, :n], mask[i, :n]), settings).loss)
    want = torch.stack(rows).sum() / mask.sum()
    want.backward()
    w = weights(old, behav, mask, CorrectionConfig(mode="ipo", eps=eps))
    got, got_grad, _ = thinkrl_loss("grpo", {"aggregation": "token-mean"}, old, old, adv, mask, is_weights=w)
    assert abs(got.item() - want.item()) <= TOL
    assert (got_grad - torch.where(mask, lp.grad, 0.0)).abs().max().item() <= TOL
    assert (w[mask] == 0).any() and (w[mask] > 0).any()
