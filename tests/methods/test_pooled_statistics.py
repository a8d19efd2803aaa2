"""Methods with batch statistics, split over two processes: each half of the batch with TokenBatch.gather gives the
loss and gradient of the whole batch in one call (the quantile, the top-k ranking and its tie rule span both).

Two ranks are simulated in one process: each half is run once to record what it pools, in call order (what a
loss pools depends only on its own batch), then again with a gather that returns both halves' values in rank
order, as thinkrl.distributed.gather_rows does across processes (tests/dist_matrix.py runs the real thing).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.methods import get_method

CASES = {
    "entropy_fork": {},
    "stapo": {"tau_p": 0.5, "entropy_quantile": 0.75},  # the threshold decides which tokens are silenced here
    "ict": {"frac": 0.3},
    "ict-position": {"frac": 0.3, "unit": "position"},
    "stare": {"target_entropy": 9.0, "variant": "c2", "top_ratio": 0.25},  # the gate open
    "clip_cov": {"clip_ratio": 0.05, "cov_lb": 0.0, "cov_ub": 9.0},  # one token of 18 drawn (each half alone: one each)
    "kl_cov": {"kl_ratio": 0.2},  # the top 3 of 18 tokens by covariance, across the halves
}


def batch(logp: torch.Tensor) -> TokenBatch:
    """B = 4 rows of T = 6 with padding in rows 0 and 2, repeated ids and tied statistics (ties cross the halves)."""
    g = torch.Generator().manual_seed(3)
    B, T = logp.shape
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:], mask[2, 2:] = False, False
    ent = (torch.rand(B, T, generator=g) * 2).round(decimals=1)  # ties
    return TokenBatch(
        logp=logp,
        old_logp=logp.detach() + 0.1 * torch.randn(B, T, generator=g),
        behav_logp=logp.detach(),
        advantages=torch.tensor([1.0, -0.5, 0.7, -1.2]),
        mask=mask,
        token_ids=torch.randint(0, 5, (B, T), generator=g),
        entropy=ent,
        token_js=(torch.rand(B, T, generator=g)).round(decimals=1),
        uniform=torch.rand(B, T, generator=g),
    )


def loss_and_grad(method, whole: TokenBatch, rows: slice, gather=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of `rows` of the batch (global counts kept) and its gradient with respect to their logp."""
    logp = whole.logp.detach()[rows].clone().requires_grad_()
    part = {f.name: getattr(whole, f.name) for f in dataclasses.fields(whole)}
    part = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in part.items()}
    loss, _ = method.loss(TokenBatch(**{**part, "logp": logp, "gather": gather}))
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("case", CASES)
def test_two_halves_with_gather_give_the_whole_batch(case):
    method = get_method(case.split("-")[0], **CASES[case])
    if case == "stare":
        method.gate = True
    g = torch.Generator().manual_seed(0)
    whole = batch(-torch.rand(4, 6, generator=g) * 3 - 0.05)
    loss, grad = loss_and_grad(method, whole, slice(None))
    halves = [slice(0, 2), slice(2, 4)]
    pooled: list[list[torch.Tensor]] = [[], []]
    for r, rows in enumerate(halves):  # what each rank pools, call by call

        def record(x, r=r):
            pooled[r].append(x.clone())
            return x, 0

        loss_and_grad(method, whole, rows, record)
    parts = []
    for r, rows in enumerate(halves):
        calls = iter(range(len(pooled[r])))

        def gather(x, r=r, calls=calls):
            k = next(calls)
            assert torch.equal(x, pooled[r][k])
            return torch.cat([pooled[0][k], pooled[1][k]]), len(pooled[0][k]) if r else 0

        parts.append(loss_and_grad(method, whole, rows, gather))
    assert torch.allclose(parts[0][0] + parts[1][0], loss, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(torch.cat([parts[0][1], parts[1][1]]), grad, atol=1e-7, rtol=1e-6)
    # without the gather each half takes its own statistics: the split is not the whole batch's update
    alone = [loss_and_grad(method, whole, rows) for rows in halves]
    assert not torch.allclose(torch.cat([alone[0][1], alone[1][1]]), grad, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("case", ["clip_cov", "kl_cov"])
def test_covariance_methods_pool_everything_in_one_gather(case):
    """Every value Clip-Cov and KL-Cov need over the whole batch (advantages, log-probs, and Clip-Cov's clip flags
    and uniforms) travels in one collective per loss call: each gather is a round-trip between processes."""
    method = get_method(case, **CASES[case])
    calls = []

    def gather(x):
        calls.append(tuple(x.shape))
        return x, 0

    loss_and_grad(method, batch(-torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) - 0.05), slice(0, 2), gather)
    assert len(calls) == 1, calls
