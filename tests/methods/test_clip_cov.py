"""Clip-Cov against a hand-worked covariance and selection (docs/methods.md, clip_cov)."""

import pytest
import torch
from batches import grad_of, logp_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class

# two sequences of two tokens, on-policy. mean A = 0, mean log pi = (-0.5 - 3 - 1 - 2) / 4 = -1.625:
# cov = A (log pi + 1.625) = (1.125, -1.375) for A = +1 and (-0.625, 0.375) for A = -1.
LOGP = [[-0.5, -3.0], [-1.0, -2.0]]
ADV = [[1.0, 1.0], [-1.0, -1.0]]


def test_the_one_token_with_covariance_in_the_window_loses_its_gradient():
    # only (0, 0) has 1 < cov < 5; max(1, floor(2e-4 x 4)) = 1 token is dropped. Token-mean over 4 tokens of
    # l = -A r with r = 1: (0 - 1 + 1 + 1) / 4 = 0.25; gradients -A / 4 elsewhere
    logp, batch = logp_batch(LOGP, ADV)
    loss, grad, metrics = grad_of(get_method("clip_cov"), logp, batch)
    assert loss.item() == pytest.approx(0.25)
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.25, 0.25, 0.25])
    assert metrics["cov/frac"].item() == 0.25 and metrics["clip/frac"].item() == 0.0


def test_a_token_the_ppo_clip_already_removed_is_no_candidate():
    # token (0, 0) now has r = 1.5 against pi_old, A = +1: the clip removes it, so no token is left to draw
    logp, batch = logp_batch(LOGP, ADV, old=[[-0.5 - 0.405465, -3.0], [-1.0, -2.0]])
    _, _, metrics = grad_of(get_method("clip_cov"), logp, batch)
    assert metrics["cov/frac"].item() == 0.0 and metrics["clip/frac"].item() == 0.25


def test_the_draw_takes_the_candidates_with_the_smallest_uniform_numbers():
    # window (-1, 5): every token but (0, 1) (cov -1.375) is a candidate; clip_ratio 0.5 -> 2 tokens drawn:
    # the two candidates with the smallest batch.uniform, (1, 1) at 0.1 and (0, 0) at 0.3 ((0, 1)'s 0.0 is no candidate)
    logp, batch = logp_batch(LOGP, ADV)
    batch.uniform = torch.tensor([[0.3, 0.0], [0.6, 0.1]])
    _, grad, metrics = grad_of(get_method("clip_cov", clip_ratio=0.5, cov_lb=-1.0), logp, batch)
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.25, 0.25, 0.0])
    assert metrics["cov/frac"].item() == 0.5


def test_clip_cov_help_and_config():
    assert "arXiv 2505.22617" in method_class("clip_cov").help()
    assert get_method("clip_cov").requires == {"uniform"}  # the trainer's per-token draws decide the subset
    with pytest.raises(UserError, match="cov_lb must be below cov_ub, got 5.0 and 1.0"):
        get_method("clip_cov", cov_lb=5.0, cov_ub=1.0)
    with pytest.raises(UserError, match="clip_ratio must be in"):
        get_method("clip_cov", clip_ratio=0.0)
