"""SIS (methods.md 3.1) and ICT (3.7) against their hand-worked sanity cases."""

import math
from pathlib import Path

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.config.load import load_config, resolve
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods._common import aggregate
from thinkrl.methods.ict import select_tokens
from thinkrl.methods.sis import rejection_test
from thinkrl.ops import js_divergence

CONFIGS = Path(__file__).parent.parent / "configs"

# ---------------------------------------------------------------- SIS: the vocabulary-of-4 case

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
    logp, batch, adv, mask = random_batch(off_policy=True)
    loss, _ = get_method("sis").loss(batch)
    loss.backward()
    accepted = rejection_test(random_batch(off_policy=True)[1]).accepted  # same seed -> the same u
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


# ---------------------------------------------------------------- SIS: reduction to the host, D_SIS <= D

B, T, V, K = 4, 6, 8, 3
MASK = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]]).bool()


def random_batch(off_policy: bool, seed: int = 0):
    """Full distributions over V = 8 ids: y ~ pi_old, top-3 of pi_old, pi_theta = pi_old (+ noise)."""
    g = torch.Generator().manual_seed(seed)
    logits_old = torch.randn(B, T, V, generator=g)
    lp_old = torch.log_softmax(logits_old, -1)  # (B, T, V)
    lp_theta = torch.log_softmax(logits_old + torch.randn(B, T, V, generator=g), -1) if off_policy else lp_old
    y = torch.multinomial(lp_old.exp().reshape(-1, V), 1, generator=g).reshape(B, T)
    top = lp_old.topk(K, -1)
    logp = lp_theta.gather(-1, y[..., None]).squeeze(-1).clone().requires_grad_()
    old = lp_old.gather(-1, y[..., None]).squeeze(-1)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])[:, None].expand(B, T)
    batch = TokenBatch(
        logp=logp,
        old_logp=old,
        behav_logp=old,
        advantages=adv,
        mask=MASK,
        token_ids=y,
        topk_ids=top.indices,
        topk_old_logp=top.values,
        topk_logp=lp_theta.gather(-1, top.indices),
        generator=torch.Generator().manual_seed(seed),
    )
    return logp, batch, batch.advantages, MASK


@pytest.mark.parametrize("host", ["grpo", "dapo", "gspo"])
def test_sis_on_policy_is_exactly_the_host(host):
    # pi_theta == pi_old: every ratio in V_K is 1, so M = 1 and every token in V_K is accepted (w~ = 1 with the
    # gradient of log pi); the others have r = exp(0) = 1. Same values, same gradient as the host's loss.
    results = []
    for name in ("sis", host):
        logp, batch, _, mask = random_batch(off_policy=False)
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
    _, batch, _, mask = random_batch(off_policy=True, seed=3)
    test = rejection_test(batch)
    d = torch.where(mask, test.log_w.abs(), 0.0)
    d_sis = torch.where(test.accepted, 0.0, d)
    assert (d_sis <= d).all() and (d_sis < d).any()
    _, metrics = get_method("sis").loss(random_batch(off_policy=True, seed=3)[1])
    assert metrics["sis/D_sis"].item() <= metrics["sis/D"].item()


# ---------------------------------------------------------------- SIS: config


def test_sis_config_follows_the_host_unless_overridden():
    grpo = get_method("sis").cfg
    assert (grpo.clip_low, grpo.clip_high, grpo.aggregation) == (0.2, 0.2, "seq-mean-token-mean")
    dapo = get_method("sis", host="dapo").cfg
    assert (dapo.clip_low, dapo.clip_high, dapo.aggregation) == (0.2, 0.28, "token-mean")
    gspo = get_method("sis", host="gspo", clip_high=1e-3).cfg
    assert (gspo.clip_low, gspo.clip_high, gspo.aggregation) == (3e-4, 1e-3, "seq-mean-token-mean")
    m = get_method("sis", k=50)
    assert m.topk_width == 50 and m.requires == {"topk_ids", "topk_old_logp", "topk_logp", "token_ids"}
    assert m.reinforce_on_policy


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"k": 0}, "k must be >= 1, got 0"),
        ({"clip_low": 1.5}, r"clip_low must be in \[0, 1\].*got 1.5"),
        ({"clip_high": -0.1}, "clip_high must be >= 0, got -0.1"),
        ({"norm_length": -1}, "norm_length must be >= 0"),
        ({"host": "ppo"}, "method.host: 'ppo' is not one of"),
        ({"topk": 5}, "unknown key method.topk"),
    ],
)
def test_sis_config_is_validated(overrides, message):
    with pytest.raises(UserError, match=message):
        get_method("sis", **overrides)


def test_sis_needs_the_top_k_fields():
    logp = torch.zeros(1, 2, requires_grad=True)
    batch = TokenBatch(logp=logp, old_logp=logp.detach(), behav_logp=logp.detach(), advantages=torch.ones(1), mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="sis needs batch.token_ids"):
        get_method("sis").loss(batch)


# ---------------------------------------------------------------- ICT: JS divergence


def test_js_divergence_values():
    # disjoint one-hots: m = [.5, .5], each KL = ln 2 -> JS = ln 2
    assert js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(math.log(2))
    # p = pbar -> 0
    assert js_divergence(torch.tensor([0.2, 0.8]), torch.tensor([0.2, 0.8])).item() == pytest.approx(0.0, abs=1e-7)
    # three positions, pbar = [.4667, .2, .3333]; position 3 is the most distinctive
    P = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]], dtype=torch.float64)
    pbar = P.mean(0)
    assert torch.allclose(pbar, torch.tensor([1.4 / 3, 0.2, 1 / 3], dtype=torch.float64))
    js = js_divergence(P, pbar)  # (N, V), (V,) -> (N,)
    assert torch.allclose(js, torch.tensor([0.04488, 0.04235, 0.12235], dtype=torch.float64), atol=1e-5)
    # zeros in p only: 0 log 0 = 0, finite; bounded by ln 2
    js = js_divergence(torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.isfinite(js).all() and (js <= math.log(2)).all() and js[0].item() == pytest.approx(math.log(2))


# ---------------------------------------------------------------- ICT: selection

# Hand example (pad = padding). Token-id scores = mean JS over occurrences:
#   id 9: 0.40;  id 5: (0.60 + 0.00) / 2 = 0.30;  id 7: (0.10 + 0.30) / 2 = 0.20;  id 8: (0.25 + 0.05) / 2 = 0.15
IDS = torch.tensor([[5, 7, 5, 9], [7, 8, 8, 0]])
JS = torch.tensor([[0.60, 0.10, 0.00, 0.40], [0.30, 0.25, 0.05, 0.0]])
HAND_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool()


def hand_batch():
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    batch = TokenBatch(
        logp=logp,
        old_logp=logp.detach(),
        behav_logp=logp.detach(),
        advantages=torch.tensor([1.0, -1.0]),
        mask=HAND_MASK,
        token_ids=IDS,
        token_js=JS,
    )
    return logp, batch


def test_ict_token_id_and_position_select_differently():
    # token_id, frac 0.5: 4 ids -> k = 2 -> ids {9, 5} -> positions (0,0), (0,2), (0,3); (0,2) has JS 0 but
    # its id is kept. position, frac 0.4: 7 valid -> k = ceil(2.8) = 3 -> JS 0.60, 0.40, 0.30 -> (0,0), (0,3), (1,0)
    keep, units, kept = select_tokens(JS, HAND_MASK, 0.5, "token_id", IDS)
    assert keep.tolist() == [[True, False, True, True], [False, False, False, False]] and (units, kept) == (4, 2)
    keep, units, kept = select_tokens(JS, HAND_MASK, 0.4, "position")
    assert keep.tolist() == [[True, False, False, True], [True, False, False, False]] and (units, kept) == (7, 3)
    # the loss: r = 1, A = [+1, -1], token-mean over all 7 valid tokens. token_id: -(1 + 1 + 1) / 7;
    # position: (-1 - 1 + 1) / 7. Gradient -A / 7 on selected tokens, exactly 0 elsewhere.
    for unit, frac, value in (("token_id", 0.5, -3 / 7), ("position", 0.4, -1 / 7)):
        logp, batch = hand_batch()
        loss, metrics = get_method("ict", unit=unit, frac=frac).loss(batch)
        loss.backward()
        keep = select_tokens(JS, HAND_MASK, frac, unit, IDS)[0]
        assert loss.item() == pytest.approx(value)
        expected = torch.where(keep, -torch.tensor([1.0, -1.0])[:, None] / 7, 0.0)
        assert torch.allclose(logp.grad, expected)
        assert metrics["select/frac"].item() == pytest.approx(3 / 7)


def test_ict_ties_at_the_threshold_are_all_kept_whatever_the_order():
    # positions: JS [0.5, 0.3, 0.3, 0.1], frac 0.5 -> k = 2, 2nd best 0.3 -> both 0.3 kept (3 of 4)
    js, mask = torch.tensor([[0.5, 0.3, 0.3, 0.1]]), torch.ones(1, 4, dtype=torch.bool)
    assert select_tokens(js, mask, 0.5, "position")[0].tolist() == [[True, True, True, False]]
    # token ids: ids 3 and 4 tie at 0.3 -> both kept; the same selection with the rows swapped
    ids = torch.tensor([[1, 3], [4, 2]])
    js = torch.tensor([[0.5, 0.3], [0.3, 0.1]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    keep = select_tokens(js, mask, 0.5, "token_id", ids)[0]
    assert keep.tolist() == [[True, True], [True, False]]
    assert torch.equal(select_tokens(js.flip(0), mask, 0.5, "token_id", ids.flip(0))[0], keep.flip(0))
    # ceil after rounding: 0.1 x 30 = 3.0000000000000004 -> 3 positions, not 4
    js = torch.linspace(0.01, 0.3, 30)[None]
    assert select_tokens(js, torch.ones(1, 30, dtype=torch.bool), 0.1, "position")[0].sum().item() == 3


@pytest.mark.parametrize("unit", ["token_id", "position"])
def test_ict_fraction_one_is_grpo_token_mean(unit):
    results = []
    for name, overrides in (("ict", {"frac": 1.0, "unit": unit}), ("grpo", {"aggregation": "token-mean"})):
        logp, batch, _, _ = random_batch(off_policy=True)
        batch.token_js = torch.where(MASK, torch.rand(B, T, generator=torch.Generator().manual_seed(1)), 0.0)
        loss, _ = get_method(name, **overrides).loss(batch)
        loss.backward()
        results.append((loss.detach(), logp.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_ict_config_and_properties():
    m = get_method("ict", reference="response")
    assert m.js_reference == "response" and type(m).batch_statistics and not m.reinforce_on_policy
    assert m.requires == {"token_js", "token_ids"}
    assert get_method("ict", unit="position").requires == {"token_js"}
    for overrides, message in (
        ({"frac": 0.0}, r"frac must be in \(0, 1\].*got 0.0"),
        ({"frac": 1.5}, "frac must be in"),
        ({"clip_low": -0.1}, "clip_low must be >= 0"),
        ({"norm_length": -1}, "norm_length must be >= 0"),
        ({"unit": "word"}, "method.unit: 'word' is not one of"),
        ({"reference": "model"}, "method.reference: 'model' is not one of"),
    ):
        with pytest.raises(UserError, match=message):
            get_method("ict", **overrides)


# ---------------------------------------------------------------- both: configs and help


@pytest.mark.parametrize("name, arxiv", [("sis", "2607.04728"), ("ict", "2606.19771")])
def test_config_file_resolves_and_help_documents_every_field(name, arxiv):
    cfg = resolve(load_config(CONFIGS / f"{name}.yaml"))
    assert cfg.method.name == name and cfg.method.params["norm_length"] == 48
    cls = method_class(name)
    text = cls.help()
    assert f"arXiv {arxiv}" in text and cls.summary()
    for line in text.split("Config fields")[1].splitlines()[1:]:
        assert "    " in line.strip(), f"field without a doc line: {line}"


def test_sis_config_file_is_off_policy():
    cfg = resolve(load_config(CONFIGS / "sis.yaml"))
    assert cfg.train.mini_batches == 4 and cfg.rollout.group_size == 16
    assert cfg.method.params["clip_low"] == 0.2 and cfg.method.params["aggregation"] == "seq-mean-token-mean"
