"""DAPO against the hand-worked sanity cases in docs/methods.md, dapo."""

import math

import pytest
import torch
from batches import ratio_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class


def test_dapo_clip_higher_keeps_the_gradient_that_grpo_clips():
    # r = 1.25, A = +1. grpo (eps_high 0.2): max(-1.25, -1.2) = -1.2, clipped branch -> gradient 0.
    logp, batch = ratio_batch([[math.log(1.25)]], [1.0])
    loss, metrics = get_method("grpo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2)
    assert logp.grad.item() == 0.0
    assert metrics["clip/high_frac"].item() == 1.0
    # dapo (eps_high 0.28): 1.25 < 1.28 -> l = -r A = -1.25, d l / d logp = -A r = -1.25
    logp, batch = ratio_batch([[math.log(1.25)]], [1.0])
    loss, metrics = get_method("dapo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.25)
    assert logp.grad.item() == pytest.approx(-1.25)
    assert metrics["clip/frac"].item() == 0.0


def test_dapo_is_token_mean():
    # A = -1, r = 1 everywhere -> l = 1 per token; token-mean over 6 tokens of rows [2, 4] = 1, and each
    # token's gradient is 1/6 whatever its row's length (seq-mean-token-mean would give 1/4 and 1/8)
    logp, batch = ratio_batch([[0.0] * 4, [0.0] * 4], [-1.0, -1.0], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = get_method("dapo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(1.0)
    assert torch.allclose(logp.grad, torch.tensor([[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4]))


def test_dapo_advantage_estimator_is_grpo():
    assert method_class("dapo").advantage == "grpo"


def test_dapo_help_names_its_paper():
    assert "arXiv 2503.14476" in method_class("dapo").help()


def test_dapo_config_is_validated():
    # a negative clip_low: test_method_contract.py::test_negative_clip_is_rejected
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method("dapo", norm_length=-1)
    with pytest.raises(UserError, match="method.clip_hihg.*did you mean clip_high"):
        get_method("dapo", clip_hihg=0.3)
