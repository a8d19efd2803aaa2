"""SIS against the hand-worked sanity cases in docs/methods.md, sis."""

import math

import pytest
import torch
from batches import CONFIGS, random_topk_batch

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods._common import aggregate
from thinkrl.methods.sis import rejection_test
from thinkrl.settings import load_config, resolve, resolve_with_method

# ---------------------------------------------------------------- the vocabulary-of-4 case

PI_OLD = torch.tensor([0.5, 0.3, 0.15, 0.05])
PI_THETA = torch.tensor([0.4, 0.4, 0.1, 0.1])
# K = 2 -> V_K = {0, 1}; ratios there 0.8 and 4/3, so the envelope M = 4/3


def vocab4_batch(tokens, adv, seed=0, generator=True, topk_old=None):
    """One row, every position with the distributions above; logp is a leaf that carries grad."""
    y = torch.as_tensor(tokens)[None]  # (1, T)
    T = y.shape[1]
    logp = PI_THETA.log()[y].clone().requires_grad_()
    topk_old = PI_OLD[:2].log() if topk_old is None else topk_old
    K = len(topk_old)
    batch = TokenBatch(
        logp=logp,
        old_logp=PI_OLD.log()[y],
        behav_logp=PI_OLD.log()[y],
        advantages=torch.tensor([adv], dtype=torch.float32),
        mask=torch.ones(1, T),
        token_ids=y,
        topk_ids=torch.arange(K).expand(1, T, K),
        topk_old_logp=topk_old.expand(1, T, K),
        topk_logp=PI_THETA[:K].log().expand(1, T, K),
        generator=torch.Generator().manual_seed(seed) if generator else None,
    )
    return logp, batch


def test_sis_acceptance_probabilities():
    # w / M: token 0: 0.8 / (4/3) = 0.6; token 1: (4/3) / (4/3) = 1; tokens 2, 3 are outside V_K: 0
    _, batch = vocab4_batch([0, 1, 2, 3], 1.0)
    test = rejection_test(batch)
    assert torch.allclose(test.prob, torch.tensor([[0.6, 1.0, 0.0, 0.0]]))
    assert test.in_topk.tolist() == [[True, True, False, False]]
    assert test.accepted[0, 1] and not test.accepted[0, 2:].any()  # u < 1 always; prob 0 never


@pytest.mark.parametrize("token, w", [(2, 0.1 / 0.15), (3, 0.1 / 0.05)])
def test_sis_tokens_outside_topk_keep_their_ratio(token, w):
    # rejected: w~ = w = 0.6667 (token 2) and 2.0 (token 3). With the clip opened (range [0, 10]) and A = -1
    # the loss is -A w~ = w~, and d l / d logp = -A w~ = w~ (one token, token-mean)
    logp, batch = vocab4_batch([token], -1.0)
    loss, metrics = get_method("sis", host="dapo", clip_low=1.0, clip_high=9.0).loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(w, rel=1e-5)
    assert logp.grad.item() == pytest.approx(w, rel=1e-5)
    assert metrics["sis/outside_topk_frac"].item() == 1.0
    # with the host's clip 0.2 and A = +1 a rejected token is an ordinary grpo token: w = 2 -> l = -1.2,
    # gradient 0; w = 0.6667 < 0.8 is unclipped on this side: l = -0.6667, gradient -0.6667
    logp, batch = vocab4_batch([token], 1.0)
    loss, _ = get_method("sis").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-min(w, 1.2), rel=1e-5)
    assert logp.grad.item() == pytest.approx(0.0 if w > 1.2 else -w, rel=1e-5)


def test_sis_accepted_token_gets_the_reinforce_gradient():
    # token 1: w = 4/3, accepted with probability 1. Plain grpo clips it (A = +1, 4/3 > 1.2: gradient 0);
    # SIS gives w~ = 1 with the gradient of log pi: l = -A, d l / d logp = -A = -1, REINFORCE's
    logp, batch = vocab4_batch([1], 1.0)
    loss, metrics = get_method("grpo").loss(batch)
    loss.backward()
    assert logp.grad.item() == 0.0
    logp, batch = vocab4_batch([1], 1.0)
    loss, metrics = get_method("sis").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logp.grad.item() == pytest.approx(-1.0)
    assert metrics["sis/accept_frac"].item() == 1.0 and metrics["clip/frac"].item() == 0.0


def test_sis_accepted_tokens_match_reinforce_in_a_random_off_policy_batch():
    logp, batch, adv, mask = random_topk_batch(off_policy=True)
    loss, _ = get_method("sis").loss(batch)
    loss.backward()
    accepted = rejection_test(random_topk_batch(off_policy=True)[1]).accepted  # same seed -> the same u
    assert 0 < accepted.sum() < mask.sum()
    ref_logp = logp.detach().clone().requires_grad_()
    aggregate(-adv * ref_logp, mask, "seq-mean-token-mean", int(mask.sum()), mask.shape[0]).backward()
    assert torch.allclose(logp.grad[accepted], ref_logp.grad[accepted], atol=1e-7)


def test_sis_divergence_sums_worked_example():
    # tokens [1, 2, 3]: |log w| = ln(4/3) + ln(3/2) + ln 2 = ln 4 = 1.386294 = D; token 1 is always accepted,
    # so D_SIS = ln(3/2) + ln 2 = ln 3 = 1.098612
    _, batch = vocab4_batch([1, 2, 3], 1.0)
    _, metrics = get_method("sis").loss(batch)
    assert metrics["sis/D"].item() == pytest.approx(math.log(4), rel=1e-5)
    assert metrics["sis/D_sis"].item() == pytest.approx(math.log(3), rel=1e-5)


def test_sis_monte_carlo_acceptance():
    # y ~ pi_old, 1e5 draws: P(accept) = 0.5 * 0.6 + 0.3 * 1 = 0.6; accepted ids are 0 and 1 with 0.3 each,
    # i.e. [0.5, 0.5] = pi_theta renormalised on V_K
    g = torch.Generator().manual_seed(123)
    y = torch.multinomial(PI_OLD, 100_000, replacement=True, generator=g)
    _, batch = vocab4_batch(y, 1.0, seed=7)
    z = rejection_test(batch).accepted[0]
    assert z.float().mean().item() == pytest.approx(0.6, abs=0.01)
    ids = y[z]
    assert (ids == 0).float().mean().item() == pytest.approx(0.5, abs=0.01)
    assert (ids == 1).float().mean().item() == pytest.approx(0.5, abs=0.01)
    assert z[y == 0].float().mean().item() == pytest.approx(0.6, abs=0.01)
    assert z[y == 1].all() and not z[y >= 2].any()
    _, metrics = get_method("sis").loss(batch)  # a fresh draw: the metric agrees too
    assert metrics["sis/accept_frac"].item() == pytest.approx(0.6, abs=0.01)
    assert metrics["sis/accept_prob"].item() == pytest.approx(0.6, abs=0.01)


def test_sis_redraws_u_each_call_and_falls_back_to_the_global_rng():
    _, batch = vocab4_batch([0] * 200, 1.0, generator=False)  # acceptance 0.6 everywhere
    torch.manual_seed(5)
    first, second = rejection_test(batch).accepted, rejection_test(batch).accepted
    assert not torch.equal(first, second)
    torch.manual_seed(5)
    assert torch.equal(rejection_test(batch).accepted, first)


def test_sis_zero_probability_topk_entries_are_outside_the_support():
    # K = 3 from a top-2-truncated sampler: the third entry is its finite stand-in -1e4 for log 0. It is not
    # in V_K (token 2 is rejected) and leaves the envelope at 4/3 (token 0 still 0.6), instead of e^20
    _, batch = vocab4_batch([0, 2], 1.0, topk_old=torch.tensor([0.5, 0.3, 0.0]).log().clamp(min=-1e4))
    test = rejection_test(batch)
    assert torch.allclose(test.prob, torch.tensor([[0.6, 0.0]]))


def test_sis_gspo_host_off_policy_accepted_tokens_add_nothing_to_log_s():
    # tokens [1, 2, 3]: log w = ln(4/3), ln(2/3), ln 2. Token 1 is always accepted (w / M = 1) and adds 0 to log s_i;
    # tokens 2 and 3 lie outside V_K, are rejected and keep log w. log s_i = (0 + ln(2/3) + ln 2) / 3 = ln(4/3) / 3,
    # s_i = (4/3)^(1/3) = 1.1006424 (plain gspo: (16/9)^(1/3) = 1.2114137). With the clip opened and A = -1,
    # l_t = -A s_i = s_i at every token: seq-mean-token-mean loss s_i, gradient -A s_i / 3 = 0.3668808 per token
    logp, batch = vocab4_batch([1, 2, 3], -1.0)
    loss, m = get_method("sis", host="gspo", clip_low=1.0, clip_high=9.0).loss(batch)
    loss.backward()
    s_i = (4 / 3) ** (1 / 3)
    assert m["sis/accept_frac"].item() == pytest.approx(1 / 3) and m["ratio/sis_mean"].item() == pytest.approx(s_i, rel=1e-5)
    assert loss.item() == pytest.approx(s_i, rel=1e-5)
    assert torch.allclose(logp.grad, torch.full((1, 3), s_i / 3), rtol=1e-5)
    logp, batch = vocab4_batch([1, 2, 3], -1.0)
    assert get_method("gspo", clip_low=1.0, clip_high=9.0).loss(batch)[0].item() == pytest.approx((16 / 9) ** (1 / 3), rel=1e-5)


def test_sis_gspo_host_all_accepted_sequence_is_reinforce():
    # tokens [1, 1]: both accepted, log s_i = 0, s_i = 1: inside gspo's 3e-4 / 4e-4 window, so the gradient is
    # REINFORCE's -A / 2 per token. Plain gspo has s_i = 4/3 there: clipped (A = +1), no gradient at all.
    logp, batch = vocab4_batch([1, 1], 1.0)
    loss, m = get_method("sis", host="gspo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0) and torch.allclose(logp.grad, torch.full((1, 2), -0.5))
    assert m["clip/frac"].item() == 0.0 and m["ratio/sis_mean"].item() == 1.0
    logp, batch = vocab4_batch([1, 1], 1.0)
    loss, m = get_method("gspo").loss(batch)
    loss.backward()
    assert m["clip/frac"].item() == 1.0 and logp.grad.abs().max().item() == 0.0


# ---------------------------------------------------------------- reduction to the host, D_SIS <= D


@pytest.mark.parametrize("host", ["grpo", "dapo", "gspo"])
def test_sis_on_policy_is_exactly_the_host(host):
    # pi_theta == pi_old: every ratio in V_K is 1, so M = 1 and every token in V_K is accepted (w~ = 1 with the
    # gradient of log pi); the others have r = exp(0) = 1. Same values, same gradient as the host's loss.
    results = []
    for name in ("sis", host):
        logp, batch, _, mask = random_topk_batch(off_policy=False)
        loss, metrics = get_method(name, **({"host": host} if name == "sis" else {})).loss(batch)
        loss.backward()
        results.append((loss.detach(), logp.grad, metrics))
    (sis_loss, sis_grad, m), (host_loss, host_grad, _) = results
    assert torch.equal(sis_loss, host_loss)
    assert torch.equal(sis_grad, host_grad)
    assert m["sis/accept_frac"].item() == pytest.approx(1.0 - m["sis/outside_topk_frac"].item())
    assert 0 < m["sis/outside_topk_frac"].item() < 1  # both branches were exercised
    assert m["sis/D"].item() == 0.0 and m["sis/D_sis"].item() == 0.0


def test_sis_divergence_is_never_larger_token_by_token():
    # D_SIS = sum (1 - z) |log w| <= D = sum |log w|, token by token; strictly smaller where a token with
    # w != 1 was accepted
    _, batch, _, mask = random_topk_batch(off_policy=True, seed=3)
    test = rejection_test(batch)
    d = torch.where(mask, test.log_w.abs(), 0.0)
    d_sis = torch.where(test.accepted, 0.0, d)
    assert (d_sis <= d).all() and (d_sis < d).any()
    _, metrics = get_method("sis").loss(random_topk_batch(off_policy=True, seed=3)[1])
    assert metrics["sis/D_sis"].item() <= metrics["sis/D"].item()


# ---------------------------------------------------------------- config and help


def test_sis_config_follows_the_host_unless_overridden():
    grpo = get_method("sis").cfg
    assert (grpo.clip_low, grpo.clip_high, grpo.aggregation) == (0.2, 0.2, "seq-mean-token-mean")
    dapo = get_method("sis", host="dapo").cfg
    assert (dapo.clip_low, dapo.clip_high, dapo.aggregation) == (0.2, 0.28, "token-mean")
    gspo = get_method("sis", host="gspo", clip_high=1e-3).cfg
    assert (gspo.clip_low, gspo.clip_high, gspo.aggregation) == (3e-4, 1e-3, "seq-mean-token-mean")
    m = get_method("sis", k=50)
    assert m.topk_width == 50 and m.requires == {"topk_ids", "topk_old_logp", "topk_logp", "token_ids", "uniform"}
    assert m.reinforce_on_policy


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"k": 0}, "k must be >= 1, got 0"),
        ({"clip_low": 1.5}, r"clip_low must be in \[0, 1\].*got 1.5"),
        ({"norm_length": -1}, "norm_length must be >= 0"),
        ({"host": "ppo"}, "method.host: 'ppo' is not one of"),
        ({"topk": 5}, "unknown key method.topk"),
    ],
)
def test_sis_config_is_validated(overrides, message):
    # a negative clip_low or clip_high: test_method_contract.py::test_negative_clip_is_rejected
    with pytest.raises(UserError, match=message):
        get_method("sis", **overrides)


def test_sis_needs_the_top_k_fields():
    logp = torch.zeros(1, 2, requires_grad=True)
    batch = TokenBatch(logp=logp, old_logp=logp.detach(), behav_logp=logp.detach(), advantages=torch.ones(1), mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="sis needs batch.token_ids"):
        get_method("sis").loss(batch)


def test_sis_config_file_and_help():
    # resolving to method.name sis and documenting every field: test_method_contract.py
    assert resolve_with_method(load_config(CONFIGS / "sis.yaml"))[1].cfg.norm_length == 48
    assert "arXiv 2607.04728" in method_class("sis").help()


def test_sis_config_file_is_off_policy():
    cfg = resolve(load_config(CONFIGS / "sis.yaml"))
    assert cfg.train.mini_batches == 4 and cfg.rollout.group_size == 16
    assert cfg.method.params["clip_low"] == 0.2 and cfg.method.params["aggregation"] == "seq-mean-token-mean"


def test_sis_recipe_makes_the_sampler_its_proposal_however_stale():
    """The paper's proposal is the policy that generated the tokens: with the recipe pi_old and the top-K come
    from the sampler (train.old_policy=sampler), which records K ids per position, even rollout.staleness steps
    behind the trainer; a recomputed pi_old would be the trainer's policy at the phase's start instead."""
    from thinkrl.settings import load_config, resolve
    from thinkrl.train import _sampler_records

    cfg = resolve(load_config(overrides=["rollout.staleness=2"], **{"method.name": "sis"}))
    assert cfg.train.old_policy == "sampler"
    assert _sampler_records(get_method("sis"), cfg) == {"record_topk": 10, "record_entropy": False}
    plain = resolve(load_config(recipe="none", **{"method.name": "sis"}))
    assert plain.train.old_policy == "recompute" and _sampler_records(get_method("sis"), plain) == {}


def test_sis_forced_acceptance_trains_every_token_at_weight_one():
    # accept=all, the probe's control: tokens [2, 3] lie outside V_K, so the test rejects both (ratios 2/3 and
    # 2: with A = +1 and grpo's clip, l = -(2/3 + 1.2) / 2, gradients -1/3 and 0). Forced, each is accepted:
    # w~ = 1 with the gradient of log pi, l = -A = -1 per token, d l / d logp = -1/2 each (token-mean of 2)
    logp, batch = vocab4_batch([2, 3], 1.0)
    loss, _ = get_method("sis").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-(2 / 3 + 1.2) / 2, rel=1e-5)
    assert logp.grad.tolist()[0] == pytest.approx([-1 / 3, 0.0], abs=1e-6)
    logp, batch = vocab4_batch([2, 3], 1.0)
    loss, metrics = get_method("sis", accept="all").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logp.grad.tolist()[0] == pytest.approx([-0.5, -0.5])
    assert metrics["sis/accept_frac"].item() == 1.0 and metrics["clip/frac"].item() == 0.0
