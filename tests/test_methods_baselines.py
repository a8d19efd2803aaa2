"""Dr.GRPO, DAPO, GSPO and CISPO against the hand-worked sanity cases of methods.md 2.3-2.6."""

import math
from pathlib import Path

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.config.load import load_config, resolve
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class

CONFIGS = Path(__file__).parent.parent / "configs"


def batch_of(log_ratios, adv, mask=None, old=-2.0):
    """Log-ratios (B, T) over a constant old log-prob; logp is a leaf that carries grad."""
    log_ratios = torch.tensor(log_ratios, dtype=torch.float32)
    logp = (old + log_ratios).requires_grad_()
    mask = torch.ones_like(log_ratios) if mask is None else torch.tensor(mask)
    batch = TokenBatch(
        logp=logp,
        old_logp=torch.full_like(log_ratios, old),
        behav_logp=torch.full_like(log_ratios, old),
        advantages=torch.tensor(adv, dtype=torch.float32),
        mask=mask,
    )
    return logp, batch


# ---------------------------------------------------------------- 2.3 Dr.GRPO


def test_dr_grpo_aggregation_worked_example():
    # A = -1 and r >= 1: l = max(r, clip(r, 0.8, 1.2)) = r, so ratios [1,2] and [3,4,5,6] give exactly the
    # per-token losses of methods.md 1.4. seq-mean-token-sum-norm, N = 2, L = 8: 21 / 16 = 1.3125.
    # d l / d logp = r (unclipped branch), so each token's gradient is r / 16.
    r = [[1.0, 2.0, 1.0, 1.0], [3.0, 4.0, 5.0, 6.0]]
    logp, batch = batch_of([[math.log(v) for v in row] for row in r], [-1.0, -1.0], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = get_method("dr_grpo", norm_length=8).loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(1.3125)
    expected = torch.tensor([[1 / 16, 2 / 16, 0, 0], [3 / 16, 4 / 16, 5 / 16, 6 / 16]])
    assert torch.allclose(logp.grad, expected)


def test_dr_grpo_norm_length_is_the_budget_in_the_trainer_and_padded_length_alone():
    # configs/dr_grpo.yaml resolves norm_length 0 to rollout.max_new_tokens = 48
    assert resolve(load_config(CONFIGS / "dr_grpo.yaml")).method.params["norm_length"] == 48
    # used directly with norm_length 0: L = padded T = 4, so the same batch gives 21 / (2 * 4) = 2.625
    r = [[1.0, 2.0, 1.0, 1.0], [3.0, 4.0, 5.0, 6.0]]
    _, batch = batch_of([[math.log(v) for v in row] for row in r], [-1.0, -1.0], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    assert get_method("dr_grpo").loss(batch)[0].item() == pytest.approx(2.625)


# ---------------------------------------------------------------- 2.4 DAPO


def test_clip_higher_keeps_the_gradient_that_grpo_clips():
    # r = 1.25, A = +1. grpo (eps_high 0.2): max(-1.25, -1.2) = -1.2, clipped branch -> gradient 0.
    logp, batch = batch_of([[math.log(1.25)]], [1.0])
    loss, metrics = get_method("grpo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2)
    assert logp.grad.item() == 0.0
    assert metrics["clip/high_frac"].item() == 1.0
    # dapo (eps_high 0.28): 1.25 < 1.28 -> l = -r A = -1.25, d l / d logp = -A r = -1.25
    logp, batch = batch_of([[math.log(1.25)]], [1.0])
    loss, metrics = get_method("dapo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.25)
    assert logp.grad.item() == pytest.approx(-1.25)
    assert metrics["clip/frac"].item() == 0.0


def test_dapo_is_token_mean():
    # A = -1, r = 1 everywhere -> l = 1 per token; token-mean over 6 tokens of rows [2, 4] = 1, and each
    # token's gradient is 1/6 whatever its row's length (seq-mean-token-mean would give 1/4 and 1/8)
    logp, batch = batch_of([[0.0] * 4, [0.0] * 4], [-1.0, -1.0], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = get_method("dapo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(1.0)
    assert torch.allclose(logp.grad, torch.tensor([[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4]))


# ---------------------------------------------------------------- 2.5 GSPO


def test_gspo_sequence_ratio_is_clipped_with_positive_advantage():
    # log r = [0.1, -0.1, 0.3] -> log s = 0.3 / 3 = 0.1 -> s = e^0.1 = 1.105171 > 1 + 4e-4.
    # A = +1: l = max(-1.105171, -1.0004) = -1.0004 at every token, clipped -> gradient 0.
    logp, batch = batch_of([[0.1, -0.1, 0.3]], [1.0])
    loss, metrics = get_method("gspo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0004)
    assert torch.equal(logp.grad, torch.zeros(1, 3))
    assert metrics["ratio/seq_mean"].item() == pytest.approx(1.105171, abs=1e-6)
    assert metrics["clip/high_frac"].item() == 1.0


def test_gspo_unclipped_gradient_is_the_sequence_ratio_over_length():
    # same s = 1.105171, A = -1: l = max(1.105171, 1.0004) = s, unclipped. d l / d logp_t = -A s = s per
    # token, divided by |y| = 3 (seq-mean-token-mean, one sequence): s / 3 = 0.368390 at each token.
    # A padded 4th position with a junk ratio must not enter s.
    logp, batch = batch_of([[0.1, -0.1, 0.3, 5.0]], [-1.0], mask=[[1, 1, 1, 0]])
    loss, _ = get_method("gspo").loss(batch)
    loss.backward()
    s = math.exp(0.1)
    assert loss.item() == pytest.approx(s)
    assert torch.allclose(logp.grad, torch.tensor([[s / 3, s / 3, s / 3, 0.0]]))


def test_gspo_on_policy_equals_grpo_seq_mean_token_mean():
    # all r = 1 -> s = 1 -> l = -A per token for both; same aggregation -> same loss and gradient
    lp = [[-0.5, -1.0, -2.0], [-0.1, -0.3, -0.7], [-1.5, -0.2, -0.9]]
    mask = [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    results = []
    for name in ("gspo", "grpo"):
        logp = torch.tensor(lp, requires_grad=True)
        batch = TokenBatch(
            logp=logp, old_logp=logp.detach(), behav_logp=logp.detach(), advantages=torch.tensor([1.0, -0.5, 0.3]), mask=torch.tensor(mask)
        )
        loss, _ = get_method(name).loss(batch)
        loss.backward()
        results.append((loss.detach(), logp.grad))
    (gspo_loss, gspo_grad), (grpo_loss, grpo_grad) = results
    # (-1 + 0.5 - 0.3) / 3 = -0.266667
    assert gspo_loss.item() == pytest.approx(-0.8 / 3)
    assert torch.equal(gspo_loss, grpo_loss)
    assert torch.equal(gspo_grad, grpo_grad)


# ---------------------------------------------------------------- 2.6 CISPO


def test_cispo_weight_is_capped_and_the_gradient_never_vanishes():
    # r = 3, A = +1: weight = min(3, 1.2) = 1.2 (detached), l = -1.2 * A * logp with logp = -2 + ln 3
    # = -0.901388 -> l = 1.081665; d l / d logp = -1.2 A = -1.2 (grpo would clip: gradient 0)
    logp, batch = batch_of([[math.log(3.0)]], [1.0])
    loss, metrics = get_method("cispo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 * (-2 + math.log(3.0)))
    assert logp.grad.item() == pytest.approx(-1.2)
    assert metrics["clip/high_frac"].item() == 1.0
    # r = 0.1, A = -1: grpo clips (l = 0.8, gradient 0); cispo has no lower bound: weight 0.1, gradient +0.1
    logp, batch = batch_of([[math.log(0.1)]], [-1.0])
    loss, metrics = get_method("cispo").loss(batch)
    loss.backward()
    assert logp.grad.item() == pytest.approx(0.1)
    assert metrics["clip/frac"].item() == 0.0


def test_cispo_trl_style_absolute_cap():
    # TRL's cap 5.0 is clip_high = 4.0: r = 3 is then below the cap, weight 3, gradient -3 A = -3
    logp, batch = batch_of([[math.log(3.0)]], [1.0])
    loss, _ = get_method("cispo", clip_high=4.0).loss(batch)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-3.0)


# ---------------------------------------------------------------- all four


@pytest.mark.parametrize("name, estimator", [("dr_grpo", "no_std"), ("dapo", "grpo"), ("gspo", "grpo"), ("cispo", "grpo")])
def test_advantage_estimator(name, estimator):
    assert method_class(name).advantage == estimator


@pytest.mark.parametrize(
    "name, arxiv", [("dr_grpo", "2503.20783"), ("dapo", "2503.14476"), ("gspo", "2507.18071"), ("cispo", "2506.13585")]
)
def test_help_names_the_paper_and_documents_every_field(name, arxiv):
    cls = method_class(name)
    text = cls.help()
    assert f"arXiv {arxiv}" in text
    assert cls.summary()
    for line in text.split("Config fields")[1].splitlines()[1:]:
        assert "    " in line.strip(), f"field without a doc line: {line}"  # "name = default    doc"


@pytest.mark.parametrize("name", ["dr_grpo", "dapo", "gspo", "cispo"])
def test_config_ranges_are_validated(name):
    with pytest.raises(UserError, match="clip_low( and clip_high)? must be >= 0"):  # dr_grpo: grpo's message
        get_method(name, clip_low=-0.1)
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method(name, norm_length=-1)
    with pytest.raises(UserError, match="method.clip_hihg.*did you mean clip_high"):
        get_method(name, clip_hihg=0.3)
