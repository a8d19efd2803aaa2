"""STARE (methods.md 3.3) and AIS (3.4, 5) against hand-worked cases, their controllers and their state."""

import io
import math
from pathlib import Path

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.config.load import load_config, resolve
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods._common import aggregate
from thinkrl.methods.ais import Config as AISConfig
from thinkrl.methods.ais import ais_diagnostics, ais_weights
from thinkrl.methods.stare import stare_weights, top_surprisal

CONFIGS = Path(__file__).parent.parent / "configs"


def make(logp, adv, mask=None, old=None, behav=None, old_entropy=None):
    """A TokenBatch whose logp is a fresh leaf with grad; old / behav default to logp (on-policy)."""
    logp = torch.tensor(logp, dtype=torch.float32)
    leaf = logp.clone().requires_grad_()
    old = logp.clone() if old is None else torch.tensor(old, dtype=torch.float32)
    behav = old.clone() if behav is None else torch.tensor(behav, dtype=torch.float32)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask)
    ent = None if old_entropy is None else torch.full_like(logp, old_entropy)
    batch = TokenBatch(
        logp=leaf, old_logp=old, behav_logp=behav, advantages=torch.tensor(adv, dtype=torch.float32), mask=mask, old_entropy=ent
    )
    return leaf, batch


def view(entropy, shape=(2, 3)):
    """A begin_step view whose valid tokens all have old entropy `entropy` (padding holds junk 100)."""
    mask = torch.ones(shape, dtype=torch.bool)
    mask[0, -1] = False
    lp = torch.full(shape, -1.0)
    return TokenBatch(
        logp=lp, old_logp=lp, behav_logp=lp, advantages=torch.ones(shape[0]), mask=mask, old_entropy=torch.where(mask, entropy, 100.0)
    )


def random_batch(seed=0, B=4, T=6):
    """Off-policy batch with mixed-sign advantages, some ratios past the clips (and past 10, for the dual clip)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3 - 0.05
    logp = old + 0.4 * torch.randn(B, T, generator=g)
    logp[1, 0] = old[1, 0] + math.log(12.0)  # r = 12 with A < 0: dual clip at 10
    behav = old + 0.3 * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:] = False
    return logp.tolist(), [1.0, -0.5, 0.7, -1.2], mask.tolist(), old.tolist(), behav.tolist()


def loss_and_grad(method, *args, **kw):
    leaf, batch = make(*args, **kw)
    loss, metrics = method.loss(batch)
    loss.backward()
    return loss.detach(), leaf.grad, metrics


def roundtrip(state):
    """What checkpoint.py does: torch.save, then torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---------------------------------------------------------------- STARE


def vanilla():
    """The host STARE reweights: clip 0.2 / 0.28, dual clip 10, token-mean."""
    return get_method("grpo", clip_high=0.28, dual_clip=10.0, aggregation="token-mean")


@pytest.mark.parametrize("steps", [[], [0.35]])
def test_stare_gate_off_is_bit_identical_to_the_vanilla_loss(steps):
    # no begin_step yet (the documented initial state), or a step at entropy 0.35 >= target 0.3
    stare = get_method("stare")
    for h in steps:
        stare.begin_step(view(h))
    assert not stare.gate
    args = random_batch()
    loss, grad, metrics = loss_and_grad(stare, *args)
    ref_loss, ref_grad, ref_metrics = loss_and_grad(vanilla(), *args)
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)
    assert ref_metrics["clip/dual_frac"] > 0 and torch.equal(metrics["clip/dual_frac"], ref_metrics["clip/dual_frac"])
    assert metrics["stare/reweighted_frac"] == 0 and metrics["stare/omega_mean"] == 1


def test_stare_initial_state_on_policy_is_reinforce():
    # reinforce_on_policy is False (the gate may be on), so the contract skips this; the initial state must pass it
    logp, adv, mask, _, _ = random_batch()
    _, grad, _ = loss_and_grad(get_method("stare"), logp, adv, mask)
    theta = torch.tensor(logp, requires_grad=True)
    m = torch.tensor(mask)
    aggregate(-torch.tensor(adv)[:, None] * theta, m, "token-mean", int(m.sum()), 4).backward()
    assert torch.allclose(grad, theta.grad, atol=1e-7)


def test_stare_o1_reweights_only_the_most_surprising_positive_token():
    # 10 tokens, A = +1, surprisal s = -logp = 1..10, on-policy (r = 1) -> l = -A = -1 per token.
    # k+ = min(10, max(1, ceil(0.1 * 10))) = 1: only s = 10 gets W = 1.1.
    # token-mean: (9 * -1 + 1.1 * -1) / 10 = -1.01; d l / d logp = -A r w / 10 = -0.11 there, -0.1 elsewhere.
    stare = get_method("stare")
    metrics = stare.begin_step(view(0.25))  # 0.25 < 0.3: gate on
    assert metrics["stare/gate"] == 1 and metrics["stare/entropy"] == pytest.approx(0.25)
    loss, grad, metrics = loss_and_grad(stare, [[-float(s) for s in range(1, 11)]], [1.0])
    assert loss.item() == pytest.approx(-1.01)
    assert torch.allclose(grad, torch.tensor([[-0.1] * 9 + [-0.11]]))
    assert metrics["stare/reweighted_frac"].item() == pytest.approx(0.1)
    assert metrics["stare/omega_mean"].item() == pytest.approx(1.01)


@pytest.mark.parametrize("n, k", [(10, 1), (11, 2), (30, 3), (95, 10), (5, 1), (1, 1)])
def test_stare_k_is_ceil_of_the_fraction_and_at_least_one(n, k):
    # k = min(n, max(1, ceil(0.1 n))): 11 -> ceil(1.1) = 2; 95 -> ceil(9.5) = 10; 5 -> max(1, 1) = 1;
    # 30 -> 0.1 * 30 = 3.0000000000000004 in floats, still 3. The chosen ones are the k largest surprisals.
    s = torch.arange(1.0, n + 1)[None]  # (1, n)
    omega, chosen = stare_weights(-s, torch.ones(1, n), torch.ones(1, n, dtype=torch.bool), 0.1, 1.1, None)
    assert int(chosen.sum()) == k
    assert torch.equal(chosen[0], s[0] > n - k)
    assert torch.equal(omega, torch.where(chosen, 1.1, 1.0))


def test_stare_ties_keep_the_earlier_token():
    # 11 candidates, all s = 2 -> k = 2: the first two in row-major order (row 0 pos 0, 1), every time
    s = torch.full((2, 6), 2.0)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 5] = False
    chosen = top_surprisal(s, mask, 0.1)
    assert chosen.nonzero().tolist() == [[0, 0], [0, 1]]


def test_stare_o1_never_reweights_negative_advantages_and_c2_damps_them():
    # row 0: A = +1, s = [1, 2, 3]; row 1: A = -1, s = [4, 5, 6] (the highest surprisals of the batch).
    # k+ = k- = max(1, ceil(0.3)) = 1. O1: only s = 3 gets 1.1. C2: also s = 6 gets M = 0.9.
    # On-policy l = -A: O1 token-mean (-1 - 1 - 1.1 + 1 + 1 + 1) / 6 = -0.1 / 6;
    # C2 (-1 - 1 - 1.1 + 1 + 1 + 0.9) / 6 = -0.2 / 6 = -0.033333.
    logp, adv = [[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], [1.0, -1.0]
    for variant, expected, last in (("o1", -0.1 / 6, 1.0), ("c2", -0.2 / 6, 0.9)):
        stare = get_method("stare", variant=variant)
        stare.begin_step(view(0.25))
        loss, grad, _ = loss_and_grad(stare, logp, adv)
        assert loss.item() == pytest.approx(expected)
        # d l / d logp = -A w / 6
        assert torch.allclose(grad, torch.tensor([[-1, -1, -1.1], [1, 1, last]]) / 6)
    _, batch = make(logp, adv)
    omega, _ = stare_weights(batch.logp, batch.advantages, batch.mask, 0.1, 1.1, None)
    assert torch.equal(omega[1], torch.ones(3))


@pytest.mark.parametrize("entropy, target, gate", [(0.25, 0.3, True), (0.35, 0.3, False), (0.5, 0.5, False)])
def test_stare_gate_follows_the_token_mean_entropy_of_pi_old(entropy, target, gate):
    # gate = 1[H < target], strictly. Padding holds entropy 100 and must not count: the token mean is `entropy`.
    stare = get_method("stare", target_entropy=target)
    metrics = stare.begin_step(view(entropy))
    assert stare.gate is gate
    assert metrics["stare/gate"].item() == float(gate)
    assert metrics["stare/entropy"].item() == pytest.approx(entropy)
    assert metrics["stare/W"].item() == pytest.approx(1.1) and metrics["stare/M"].item() == pytest.approx(0.9)  # static


def test_stare_adaptive_schedule():
    # W = 1.1, alpha = 0.01. Entropy 0.35 > 0.3: sigma = -1 -> W = 1.09, M = 0.91 (gate off, still updated).
    # Then 0.25 < 0.3: sigma = +1 -> back to 1.1 / 0.9.
    stare = get_method("stare", adaptive=True)
    m = stare.begin_step(view(0.35))
    assert (stare.w, stare.m) == (pytest.approx(1.09), pytest.approx(0.91))
    assert m["stare/W"].item() == pytest.approx(1.09) and m["stare/gate"] == 0
    stare.begin_step(view(0.25))
    assert (stare.w, stare.m) == (pytest.approx(1.1), pytest.approx(0.9))
    # at exactly the target (0.5: exact in float32, unlike 0.3) sigma = 0 and the gate is off
    exact = get_method("stare", adaptive=True, target_entropy=0.5)
    exact.begin_step(view(0.5))
    assert (exact.w, exact.m, exact.gate) == (1.1, 0.9, False)
    # bounds: W in [1, w_max], M in [m_min, 1]
    low = get_method("stare", adaptive=True, w=1.0, m=1.0, alpha=0.5)
    low.begin_step(view(0.35))
    assert (low.w, low.m) == (1.0, 1.0)
    high = get_method("stare", adaptive=True, w=1.4, m=0.6, alpha=0.5)
    high.begin_step(view(0.25))
    assert (high.w, high.m) == (1.5, 0.5)


def test_stare_state_round_trip_reproduces_the_next_step():
    # an adaptive controller after two steps; a fresh method loaded from its saved state must give the same
    # loss now and the same metrics at the next step. A fresh method without the state would not.
    args = random_batch(seed=3)
    first = get_method("stare", adaptive=True, variant="c2")
    for h in (0.25, 0.2):
        first.begin_step(view(h))
    second = get_method("stare", adaptive=True, variant="c2")
    second.load_state_dict(roundtrip(first.state_dict()))
    assert torch.equal(loss_and_grad(first, *args)[0], loss_and_grad(second, *args)[0])
    assert not torch.equal(loss_and_grad(get_method("stare", adaptive=True, variant="c2"), *args)[0], loss_and_grad(first, *args)[0])
    a, b = first.begin_step(view(0.1)), second.begin_step(view(0.1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["stare/W"].item() == pytest.approx(1.13)
    with pytest.raises(ValueError, match="gate, w, m, entropy"):
        second.load_state_dict({"w": 1.0})


# ---------------------------------------------------------------- AIS

RHO = [1.0, 1.2, 0.8, 1.5]
ADV = [1.0, 1.0, -1.0, -1.0]


def test_ais_worked_example_diagnostics():
    # R = (sum rho)^2 / (N sum rho^2) = 4.5^2 / (4 * 5.33) = 20.25 / 21.32 = 0.949812
    # K = mean(rho - 1 - ln rho) = (0 + 0.017678 + 0.023144 + 0.094535) / 4 = 0.033839; S = 1 - e^(-K/0.05) = 0.491751
    # rho A = [1, 1.2, -0.8, -1.5], mean -0.025, population var 1.331875; Var(A) = 1 -> V = 1.331875, P = 0.750821
    # alpha = S R P = 0.350687
    d = ais_diagnostics(torch.tensor([RHO]), torch.tensor([ADV]), torch.ones(1, 4, dtype=torch.bool), AISConfig())
    expected = {
        "reliability": 0.949812,
        "kl": 0.033839,
        "severity": 0.491751,
        "variance_amp": 1.331875,
        "variance_penalty": 0.750821,
        "alpha": 0.350687,
    }
    for k, v in expected.items():
        assert d[k].item() == pytest.approx(v, abs=1e-6), k
    # cv = sqrt(5.33 / 4 - 1.125^2) / 1.125 = 0.229861; 1 / (1 + cv^2) = R
    assert 1 / (1 + d["cv"].item() ** 2) == pytest.approx(0.949812, abs=1e-6)
    assert d["rho_max"].item() == pytest.approx(1.5) and d["rho_above_cap"].item() == 0.0
    assert d["rho_p50"].item() == pytest.approx(1.1)  # linear between 1.0 and 1.2
    # w = (1 - alpha) + alpha min(rho, 2) = [1.0, 1.070137, 0.929863, 1.175344]
    w = ais_weights(torch.log(torch.tensor([RHO])), torch.zeros(1, 4), 0.350687, 2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 1.070137, 0.929863, 1.175344]]), atol=1e-6)


def test_ais_worked_example_through_begin_step_and_loss():
    # 4 one-token sequences, log mu = -2, log pi_old = -2 + ln rho, on-policy logp = old (r = 1) -> l = -A.
    # seq-mean-token-mean over 4 = token mean: -(1 + 1.070137 - 0.929863 - 1.175344) / 4 = 0.0087675;
    # d l / d logp_t = -A_t w_t / 4.
    old = [[-2.0 + math.log(r)] for r in RHO]
    ais = get_method("ais")
    leaf, batch = make(old, ADV, behav=[[-2.0]] * 4)
    metrics = ais.begin_step(batch)
    assert metrics["ais/alpha"].item() == pytest.approx(0.350687, abs=1e-6)
    assert metrics["ais/alpha_batch"].item() == pytest.approx(0.350687, abs=1e-6)
    assert metrics["ais/reliability"].item() == pytest.approx(0.949812, abs=1e-6)
    loss, grad, m = loss_and_grad(ais, old, ADV, behav=[[-2.0]] * 4)
    w = torch.tensor([1.0, 1.070137, 0.929863, 1.175344])
    assert loss.item() == pytest.approx(0.0087675, abs=1e-6)
    assert torch.allclose(grad[:, 0], -torch.tensor(ADV) * w / 4, atol=1e-6)
    assert m["ais/weight_mean"].item() == pytest.approx(w.mean().item(), abs=1e-6)


def test_ais_without_mismatch_is_grpo():
    # rho = 1 everywhere: K = 0 -> S = 0 -> alpha = 0 -> w = 1 exactly -> the grpo loss and gradient, bit for bit
    logp, adv, mask, old, _ = random_batch()
    ais = get_method("ais")
    _, batch = make(logp, adv, mask, old=old)  # behav = old
    metrics = ais.begin_step(batch)
    assert metrics["ais/kl"].item() == 0.0 and metrics["ais/alpha"].item() == 0.0
    loss, grad, _ = loss_and_grad(ais, logp, adv, mask, old=old)
    ref_loss, ref_grad, _ = loss_and_grad(get_method("grpo"), logp, adv, mask, old=old)
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)


def test_ais_before_any_step_is_uncorrected_even_with_mismatch():
    args = random_batch()
    loss, grad, _ = loss_and_grad(get_method("ais"), *args)
    ref_loss, ref_grad, _ = loss_and_grad(get_method("grpo"), *args)
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)


def test_ais_forced_alpha_one_is_token_tis_with_cap():
    # alpha = 1: w = min(rho, 2), which is grpo with the trainer's TIS weights is_weights = min(rho, 2)
    logp, adv, mask, old, behav = random_batch(seed=5)
    behav = (torch.tensor(behav) - 0.9 * torch.arange(6.0) / 5).tolist()  # rho up to e^0.9 * ..., some above 2
    leaf, batch = make(logp, adv, mask, old=old, behav=behav)
    rho = torch.exp(batch.old_logp - batch.behav_logp)
    assert (rho[batch.mask] > 2).any() and (rho[batch.mask] < 1).any()
    ais = get_method("ais", alpha=1.0)
    ais.begin_step(batch)  # the forced value wins over the adaptive one
    loss, metrics = ais.loss(batch)
    loss.backward()
    leaf2, batch2 = make(logp, adv, mask, old=old, behav=behav)
    batch2.is_weights = rho.clamp(max=2.0)
    ref, _ = get_method("grpo").loss(batch2)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-7) and torch.allclose(leaf.grad, leaf2.grad, atol=1e-7)
    # alpha = 0 forced: grpo whatever the mismatch
    zero = get_method("ais", alpha=0.0)
    zero.begin_step(batch)
    assert torch.equal(zero.loss(batch)[0].detach(), get_method("grpo").loss(batch)[0].detach())


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ais_reliability_is_one_over_one_plus_cv_squared(level):
    g = torch.Generator().manual_seed(7)
    rho = torch.exp(0.5 * torch.randn(3, 5, generator=g))
    mask = torch.rand(3, 5, generator=g) > 0.3
    d = ais_diagnostics(rho, torch.randn(3, 5, generator=g), mask, AISConfig(level=level))
    assert d["reliability"].item() == pytest.approx(1 / (1 + d["cv"].item() ** 2), rel=1e-12)


def test_ais_sequence_level_reliability():
    # rows [2, 0.5] and [4, 1] -> geometric means 1 and 2 -> R = (1 + 2)^2 / (2 (1 + 4)) = 0.9;
    # token level: 7.5^2 / (4 * 21.25) = 0.661765
    rho, adv, mask = torch.tensor([[2.0, 0.5], [4.0, 1.0]]), torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool)
    assert ais_diagnostics(rho, adv, mask, AISConfig(level="sequence"))["reliability"].item() == pytest.approx(0.9)
    assert ais_diagnostics(rho, adv, mask, AISConfig())["reliability"].item() == pytest.approx(56.25 / 85)


def test_ais_equal_advantages_give_no_variance_penalty_and_junk_padding_is_ignored():
    # all A = 0: Var(A) = 0 -> V := 1, P = 1. The padded token holds rho = 1e6 and must not enter anything.
    rho = torch.tensor([[1.0, 1.2, 1e6]])
    d = ais_diagnostics(rho, torch.zeros(1, 3), torch.tensor([[True, True, False]]), AISConfig())
    assert d["variance_amp"].item() == 1.0 and d["variance_penalty"].item() == 1.0
    assert d["rho_max"].item() == pytest.approx(1.2)
    assert ais_diagnostics(rho, torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.bool), AISConfig())["alpha"].item() == 0.0


def test_ais_micro_batches_after_a_step_reproduce_the_full_batch():
    # alpha is a constant during the step, so w is per token and micro-batches still add up
    logp, adv, mask, old, behav = random_batch(seed=2)
    ais = get_method("ais")
    ais.begin_step(make(logp, adv, mask, old=old, behav=behav)[1])
    assert ais.alpha > 0
    full, full_grad, _ = loss_and_grad(ais, logp, adv, mask, old=old, behav=behav)
    leaf, batch = make(logp, adv, mask, old=old, behav=behav)
    total = sum(ais.loss(part)[0] for part in batch.split([1, 3]))
    total.backward()
    assert torch.allclose(total, full, atol=1e-7) and torch.allclose(leaf.grad, full_grad, atol=1e-7)


def test_ais_ema_and_state_round_trip():
    # ema 0.9. Step 1 (worked example) initialises alpha = 0.350687; step 2 has rho = 1 (alpha_batch 0):
    # alpha = 0.9 * 0.350687 + 0.1 * 0 = 0.315618. A method loaded from the saved state continues identically.
    example = make([[-2.0 + math.log(r)] for r in RHO], ADV, behav=[[-2.0]] * 4)[1]
    matched = make([[-1.0]] * 4, ADV)[1]
    ais = get_method("ais", ema=0.9)
    assert ais.begin_step(example)["ais/alpha"].item() == pytest.approx(0.350687, abs=1e-6)
    assert ais.begin_step(matched)["ais/alpha"].item() == pytest.approx(0.315618, abs=1e-6)
    resumed = get_method("ais", ema=0.9)
    resumed.load_state_dict(roundtrip(ais.state_dict()))
    assert torch.equal(ais.loss(example)[0], resumed.loss(example)[0])
    a, b = ais.begin_step(example), resumed.begin_step(example)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # 0.9 * 0.315618 + 0.1 * 0.350687 = 0.319125
    assert a["ais/alpha"].item() == pytest.approx(0.319125, abs=1e-6)
    # without the state, a fresh method would restart the EMA at 0.350687
    assert get_method("ais", ema=0.9).begin_step(example)["ais/alpha"].item() == pytest.approx(0.350687, abs=1e-6)
    with pytest.raises(ValueError, match="alpha, started"):
        resumed.load_state_dict({})


# ---------------------------------------------------------------- both


@pytest.mark.parametrize(
    "name, override, message",
    [
        ("stare", {"top_ratio": 0.0}, r"top_ratio must be in \(0, 1\], got 0.0"),
        ("stare", {"w": 0.9}, "w must be >= 1"),
        ("stare", {"m": 1.2}, r"m must be in \(0, 1\]"),
        ("stare", {"adaptive": True, "w": 2.0}, r"w must be in \[1, w_max=1.5\] when adaptive, got 2.0"),
        ("stare", {"dual_clip": 1.0}, "dual_clip must be > 1"),
        ("stare", {"variant": "o2"}, "method.variant: 'o2' is not one of 'o1', 'c2'"),
        ("ais", {"alpha": 1.5}, r"alpha must be in \[0, 1\] or None"),
        ("ais", {"ema": 1.0}, r"ema must be in \[0, 1\)"),
        ("ais", {"kappa": 0.0}, "kappa must be > 0"),
        ("ais", {"cap": -1.0}, "cap must be > 0"),
        ("ais", {"level": "seq"}, "method.level: 'seq' is not one of 'token', 'sequence'"),
    ],
)
def test_config_ranges_are_validated(name, override, message):
    with pytest.raises(UserError, match=message):
        get_method(name, **override)


def test_ais_alpha_accepts_none_and_numbers():
    assert get_method("ais", alpha=None).cfg.alpha is None
    assert get_method("ais", alpha=1).cfg.alpha == 1.0


@pytest.mark.parametrize("name, arxiv", [("stare", "2606.19236"), ("ais", "2605.13907")])
def test_help_names_the_paper_and_documents_every_field(name, arxiv):
    cls = method_class(name)
    text = cls.help()
    assert f"arXiv {arxiv}" in text and "Relative to grpo" in text
    assert cls.summary()
    for line in text.split("Config fields")[1].splitlines()[1:]:
        assert "    " in line.strip(), f"field without a doc line: {line}"


def test_bundled_configs_resolve():
    stare = resolve(load_config(CONFIGS / "stare.yaml"))
    assert stare.method.name == "stare" and stare.rollout.dynamic_sampling
    assert stare.method.params["clip_high"] == 0.28 and stare.method.params["dual_clip"] == 10.0
    ais = resolve(load_config(CONFIGS / "ais.yaml"))
    assert ais.method.name == "ais" and ais.rollout.precision == "fp8"
    assert ais.method.params["alpha"] is None and ais.method.params["norm_length"] == 48


@pytest.mark.parametrize(
    "name, extra",
    [
        # target 100 nats: the tiny random model's entropy (about 4.6) keeps the gate on; W / M move every step
        ("stare", ["-o", "method.target_entropy=100", "-o", "method.adaptive=true", "-o", "method.alpha=0.05", "-o", "method.variant=c2"]),
        ("ais", ["-o", "rollout.precision=fp8", "-o", "method.ema=0.5"]),
    ],
)
def test_resume_continues_the_controller_exactly(tiny_model_dir, tmp_path, name, extra):
    # through the trainer: begin_step each step, the state saved in the checkpoint and loaded on --resume
    from test_cli_e2e import invoke, tiny_args

    from thinkrl.run.jsonl import read_jsonl

    extra = ["-o", f"method.name={name}", *extra]
    invoke(tiny_args(tiny_model_dir, tmp_path / "straight", 4, *extra))
    invoke(tiny_args(tiny_model_dir, tmp_path / "split", 2, *extra))
    invoke(["train", "--resume", str(tmp_path / "split"), "-o", "train.steps=4"])
    pick = lambda m: {k: v for k, v in m.items() if k in ("loss", "grad_norm", "reward/mean") or k.startswith(f"{name}/")}  # noqa: E731
    straight = [pick(m) for m in read_jsonl(tmp_path / "straight" / "metrics.jsonl")]
    split = [pick(m) for m in read_jsonl(tmp_path / "split" / "metrics.jsonl")]
    assert len(straight) == 4 and split == straight
    if name == "stare":  # not vacuous: W grew by alpha each step, 1.1 -> 1.3
        assert [m["stare/W"] for m in straight] == pytest.approx([1.15, 1.2, 1.25, 1.3]) and straight[0]["stare/gate"] == 1
    else:
        assert all(m["ais/alpha"] > 0 for m in straight) and "ais/reliability" in straight[0]


def test_requires_and_class_flags():
    assert get_method("stare").requires == {"old_entropy"} and method_class("stare").batch_statistics
    assert get_method("ais").requires == set() and not method_class("ais").batch_statistics
