"""CISPO against the hand-worked sanity cases in docs/methods.md, cispo."""

import math

import pytest
from batches import ratio_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class


def test_cispo_weight_is_capped_and_the_gradient_never_vanishes():
    # r = 3, A = +1: weight = min(3, 1.2) = 1.2 (detached), l = -1.2 * A * logp with logp = -2 + ln 3
    # = -0.901388 -> l = 1.081665; d l / d logp = -1.2 A = -1.2 (grpo would clip: gradient 0)
    logp, batch = ratio_batch([[math.log(3.0)]], [1.0])
    loss, metrics = get_method("cispo").loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 * (-2 + math.log(3.0)))
    assert logp.grad.item() == pytest.approx(-1.2)
    assert metrics["clip/high_frac"].item() == 1.0
    # r = 0.1, A = -1: grpo clips (l = 0.8, gradient 0); cispo has no lower bound: weight 0.1, gradient +0.1
    logp, batch = ratio_batch([[math.log(0.1)]], [-1.0])
    loss, metrics = get_method("cispo").loss(batch)
    loss.backward()
    assert logp.grad.item() == pytest.approx(0.1)
    assert metrics["clip/frac"].item() == 0.0


def test_cispo_trl_style_absolute_cap():
    # TRL's cap 5.0 is clip_high = 4.0: r = 3 is then below the cap, weight 3, gradient -3 A = -3
    logp, batch = ratio_batch([[math.log(3.0)]], [1.0])
    loss, _ = get_method("cispo", clip_high=4.0).loss(batch)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-3.0)


def test_cispo_advantage_estimator_is_grpo():
    assert method_class("cispo").advantage == "grpo"


def test_cispo_help_names_its_paper():
    assert "arXiv 2506.13585" in method_class("cispo").help()


def test_cispo_config_is_validated():
    # a negative clip_low: test_method_contract.py::test_negative_clip_is_rejected
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method("cispo", norm_length=-1)
    with pytest.raises(UserError, match="method.clip_hihg.*did you mean clip_high"):
        get_method("cispo", clip_hihg=0.3)
