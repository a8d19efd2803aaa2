"""Tests for the plugin example; run with: pytest examples/custom_method
(tests/test_method_contract.py also runs the shared contract over this plugin)."""

from pathlib import Path

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.methods import get_method, load_plugins

load_plugins(Path(__file__).parent)


def test_gradient_is_minus_advantage_over_sequence_length():
    # two sequences, A = [+1, -1], lengths 2 and 3: d loss / d logp = -A_i / T_i / N
    logp = torch.log(torch.full((2, 3), 0.5)).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]]).bool()
    batch = TokenBatch(logp=logp, old_logp=logp.detach(), behav_logp=logp.detach(), advantages=torch.tensor([1.0, -1.0]), mask=mask)
    loss, metrics = get_method("vanilla_pg").loss(batch)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 2 / 2, -1 / 2 / 2, 0], [1 / 3 / 2, 1 / 3 / 2, 1 / 3 / 2]]))
    # loss = (1/2) * [ -(1)(log .5) + (1)(log .5) ] = 0 here, since both rows have the same mean log-prob
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert metrics["logp/mean"].item() == pytest.approx(torch.log(torch.tensor(0.5)).item())
