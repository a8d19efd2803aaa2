"""GSPO against the hand-worked sanity cases in docs/methods.md, gspo."""

import math

import pytest
import torch
from batches import ratio_batch

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class


def test_gspo_sequence_ratio_is_clipped_with_positive_advantage():
    # log r = [0.1, -0.1, 0.3] -> log s = 0.3 / 3 = 0.1 -> s = e^0.1 = 1.105171 > 1 + 4e-4.
    # A = +1: l = max(-1.105171, -1.0004) = -1.0004 at every token, clipped -> gradient 0.
    logp, batch = ratio_batch([[0.1, -0.1, 0.3]], [1.0])
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
    logp, batch = ratio_batch([[0.1, -0.1, 0.3, 5.0]], [-1.0], mask=[[1, 1, 1, 0]])
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


def test_gspo_advantage_estimator_is_grpo():
    assert method_class("gspo").advantage == "grpo"


def test_gspo_help_names_its_paper():
    assert "arXiv 2507.18071" in method_class("gspo").help()


def test_gspo_config_is_validated():
    # a negative clip_low: test_method_contract.py::test_negative_clip_is_rejected
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method("gspo", norm_length=-1)
    with pytest.raises(UserError, match="method.clip_hihg.*did you mean clip_high"):
        get_method("gspo", clip_hihg=0.3)
