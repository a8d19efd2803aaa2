"""STARE against the hand-worked cases in docs/methods.md, stare; its entropy gate, its controller and its state."""

import pytest
import torch
from batches import CONFIGS, grad_of, logp_batch, random_lists, roundtrip, straight_and_resumed

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods._common import aggregate
from thinkrl.methods.stare import stare_weights, top_surprisal
from thinkrl.settings import load_config, resolve


def view(entropy, shape=(2, 3)):
    """A begin_step view whose valid tokens all have old entropy `entropy` (padding holds junk 100)."""
    mask = torch.ones(shape, dtype=torch.bool)
    mask[0, -1] = False
    lp = torch.full(shape, -1.0)
    return TokenBatch(
        logp=lp, old_logp=lp, behav_logp=lp, advantages=torch.ones(shape[0]), mask=mask, old_entropy=torch.where(mask, entropy, 100.0)
    )


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
    args = random_lists()
    loss, grad, metrics = grad_of(stare, *logp_batch(*args))
    ref_loss, ref_grad, ref_metrics = grad_of(vanilla(), *logp_batch(*args))
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)
    assert ref_metrics["clip/dual_frac"] > 0 and torch.equal(metrics["clip/dual_frac"], ref_metrics["clip/dual_frac"])
    assert metrics["stare/reweighted_frac"] == 0 and metrics["stare/omega_mean"] == 1


def test_stare_initial_state_on_policy_is_reinforce():
    # reinforce_on_policy is False (the gate may be on), so the contract skips this; the initial state must pass it
    logp, adv, mask, _, _ = random_lists()
    _, grad, _ = grad_of(get_method("stare"), *logp_batch(logp, adv, mask))
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
    loss, grad, metrics = grad_of(stare, *logp_batch([[-float(s) for s in range(1, 11)]], [1.0]))
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
        loss, grad, _ = grad_of(stare, *logp_batch(logp, adv))
        assert loss.item() == pytest.approx(expected)
        # d l / d logp = -A w / 6
        assert torch.allclose(grad, torch.tensor([[-1, -1, -1.1], [1, 1, last]]) / 6)
    _, batch = logp_batch(logp, adv)
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
    args = random_lists(seed=3)
    first = get_method("stare", adaptive=True, variant="c2")
    for h in (0.25, 0.2):
        first.begin_step(view(h))
    second = get_method("stare", adaptive=True, variant="c2")
    second.load_state_dict(roundtrip(first.state_dict()))
    assert torch.equal(grad_of(first, *logp_batch(*args))[0], grad_of(second, *logp_batch(*args))[0])
    assert not torch.equal(
        grad_of(get_method("stare", adaptive=True, variant="c2"), *logp_batch(*args))[0], grad_of(first, *logp_batch(*args))[0]
    )
    a, b = first.begin_step(view(0.1)), second.begin_step(view(0.1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert a["stare/W"].item() == pytest.approx(1.13)
    with pytest.raises(ValueError, match="gate, w, m, entropy"):
        second.load_state_dict({"w": 1.0})


@pytest.mark.parametrize(
    "override, message",
    [
        ({"top_ratio": 0.0}, r"top_ratio must be in \(0, 1\], got 0.0"),
        ({"w": 0.9}, "w must be >= 1"),
        ({"m": 1.2}, r"m must be in \(0, 1\]"),
        ({"adaptive": True, "w": 2.0}, r"w must be in \[1, w_max=1.5\] when adaptive, got 2.0"),
        ({"dual_clip": 1.0}, "dual_clip must be > 1"),
        ({"variant": "o2"}, "method.variant: 'o2' is not one of 'o1', 'c2'"),
    ],
)
def test_stare_config_ranges_are_validated(override, message):
    with pytest.raises(UserError, match=message):
        get_method("stare", **override)


def test_stare_help_names_its_paper():
    text = method_class("stare").help()
    assert "arXiv 2606.19236" in text and "Relative to grpo" in text


def test_stare_config_file_resolves():
    stare = resolve(load_config(CONFIGS / "stare.yaml"))  # to method.name stare: test_method_contract.py
    assert stare.rollout.dynamic_sampling
    assert stare.method.params["clip_high"] == 0.28 and stare.method.params["dual_clip"] == 10.0


def test_stare_requires_and_class_flags():
    assert get_method("stare").requires == {"old_entropy"} and method_class("stare").batch_statistics


@pytest.mark.plain
def test_stare_resume_continues_the_controller_exactly(tiny_model_dir, tmp_path):
    # through the trainer: begin_step each step, the state saved in the checkpoint and loaded on --resume.
    # target 100 nats: the tiny random model's entropy (about 4.6) keeps the gate on; W / M move every step
    extra = ["-o", "method.target_entropy=100", "-o", "method.adaptive=true", "-o", "method.alpha=0.05", "-o", "method.variant=c2"]
    runs = straight_and_resumed(tiny_model_dir, tmp_path, "-o", "method.name=stare", *extra)
    pick = lambda m: {k: v for k, v in m.items() if k in ("loss", "grad_norm", "reward/mean") or k.startswith("stare/")}  # noqa: E731
    straight, split = ([pick(m) for m in rows] for rows in runs)
    assert len(straight) == 4 and split == straight
    # not vacuous: W grew by alpha each step, 1.1 -> 1.3
    assert [m["stare/W"] for m in straight] == pytest.approx([1.15, 1.2, 1.25, 1.3]) and straight[0]["stare/gate"] == 1
