"""The helpers every method builds on (thinkrl/methods/_common.py, thinkrl/ops.py) against hand-worked cases."""

import math

import pytest
import torch

from thinkrl.methods._common import aggregate
from thinkrl.ops import js_divergence, masked_quantile, valid_positions


def test_aggregation_worked_example():
    # two sequences with per-token losses [1,2] and [3,4,5,6]
    per_token = torch.tensor([[1.0, 2, 0, 0], [3, 4, 5, 6]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    assert aggregate(per_token, mask, "token-mean", 6, 2).item() == pytest.approx(3.5)  # 21 / 6
    assert aggregate(per_token, mask, "seq-mean-token-mean", 6, 2).item() == pytest.approx(3.0)  # (1.5 + 4.5) / 2
    assert aggregate(per_token, mask, "seq-mean-token-sum", 6, 2).item() == pytest.approx(10.5)  # (3 + 18) / 2
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm", 6, 2, norm_length=8).item() == pytest.approx(1.3125)  # 21/16


def test_masked_quantile_is_torch_quantile_linear():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(5, 9, generator=g)
    mask = torch.rand(5, 9, generator=g) > 0.3
    for q in (0.0, 0.05, 0.5, 0.8, 0.9, 1.0):
        assert torch.equal(masked_quantile(x, mask, q), torch.quantile(x[mask], q))
        rows = masked_quantile(x, mask, q, dim=-1)
        for i in range(5):
            assert torch.equal(rows[i], torch.quantile(x[i][mask[i]], q))
    assert masked_quantile(x, torch.zeros_like(mask), 0.5).item() == 0.0  # empty selection -> 0


def test_valid_positions_skip_masked_tokens():
    mask = torch.tensor([[1, 1, 0, 1, 0, 1]]).bool()
    assert valid_positions(mask).tolist() == [[1, 2, 2, 3, 3, 4]]


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
