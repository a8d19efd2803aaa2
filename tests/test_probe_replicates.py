"""The probe's replicates several at a time (thinkrl/probe/replicates.py): one forward over a batch of
replicates and one backward per method, each replicate's gradient kept apart by the fused LoRA layers, give
the numbers of running them one by one; where they cannot be kept apart (the CPU speed-ups off, two replicates
sharing a prompt) they run one by one."""

from __future__ import annotations

import pytest
import torch
from test_probe import moved_start, samples

import thinkrl.probe.replicates as R
from thinkrl.accel.packed import can_pack
from thinkrl.probe.measure import ProbeSettings, directions, probe_pass
from thinkrl.probe.rollouts import Rollouts

pytestmark = pytest.mark.plain  # reaches the CPU speed-ups: make test-plain reruns it (tests/plain_marks.py)

PROMPTS = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 5], [4, 9, 10, 11, 12], [4, 30, 31, 32, 33], [4, 40, 41, 5], [4, 50, 51, 52, 53, 54]]


def _setup(tiny_model_dir, prompts):
    """Rollouts of `prompts` by the starting policy, then theta1 a step away with its reference directions."""
    policy, params, data, theta0 = moved_start(tiny_model_dir, prompts)
    d, _ = directions(policy, params, Rollouts(samples(policy, prompts[:2], seed=1), policy, 0, 1.0), theta0)
    return policy, params, data, d


def _tokens(data: Rollouts, rows: torch.Tensor) -> int:
    """A replicate's tokens as its forward runs them: its group's prompt once, then every completion."""
    return len(data.prompt_ids[int(rows[0])]) + int(data.s.comp.lengths[rows].sum())


def _budget_for_three(monkeypatch, data: Rollouts, ps: ProbeSettings) -> None:
    """PASS_TOKENS that fits the first three replicates exactly: 5 replicates run as a pass of 3, then of 2."""
    tokens = [_tokens(data, rows) for rows in R.replicate_rows(data, ps)]
    assert sum(tokens[3:]) <= sum(tokens[:3])  # the last two fit one pass of that size
    monkeypatch.setattr(R, "PASS_TOKENS", sum(tokens[:3]))


def _passes(monkeypatch) -> list[int]:
    """How many replicates each pass that kept their gradients apart measured."""
    seen, real = [], R._together

    def spy(*args):
        out = real(*args)
        if out is not None:
            seen.append(len(out))
        return out

    monkeypatch.setattr(R, "_together", spy)
    return seen


@pytest.mark.parametrize("arms", [("grpo", "gspo", "cispo"), ("dapo", "stapo")])  # stapo reads the entropy
def test_replicates_together_give_the_numbers_of_one_at_a_time(tiny_model_dir, monkeypatch, arms):
    policy, params, data, d = _setup(tiny_model_dir, PROMPTS)
    ps = ProbeSettings(arms, replicates=5, stale_prompts=1)
    _budget_for_three(monkeypatch, data, ps)
    passes = _passes(monkeypatch)
    together = R.run_replicates(policy, params, data, d, ps, lambda n: None)
    with probe_pass(policy):
        alone = [R.replicate(policy, params, data, list(arms), rows, d) for rows in R.replicate_rows(data, ps)]
    if can_pack(torch.zeros(2, 2)):  # the fused layers split the gradients
        assert passes == [3, 2]
    else:  # THINKRL_ACCEL=0 or no oneDNN: one by one
        assert passes == []
    assert len(together) == 5
    for got, want in zip(together, alone):
        for arm in arms:
            assert got[arm].keys() == want[arm].keys()
            for key, value in want[arm].items():
                assert got[arm][key] == (None if value is None else pytest.approx(value, rel=1e-4, abs=1e-6)), (arm, key)
    assert any(r[arms[0]]["grad_norm"] > 0 for r in alone)  # there were gradients to compare


def test_replicates_sharing_a_prompt_run_one_at_a_time(tiny_model_dir, monkeypatch):
    """Replicates 1 and 2 ask the same problem: the forward runs that prompt once, in one row for both, so their
    gradients cannot be told apart by rows and that pass runs them one by one; the next pass is together."""
    prompts = [*PROMPTS[:2], PROMPTS[1], *PROMPTS[3:]]
    policy, params, data, d = _setup(tiny_model_dir, prompts)
    ps = ProbeSettings(("grpo", "cispo"), replicates=5, stale_prompts=1)
    _budget_for_three(monkeypatch, data, ps)
    passes = _passes(monkeypatch)
    together = R.run_replicates(policy, params, data, d, ps, lambda n: None)
    with probe_pass(policy):
        alone = [R.replicate(policy, params, data, ["grpo", "cispo"], rows, d) for rows in R.replicate_rows(data, ps)]
    assert passes == ([2] if can_pack(torch.zeros(2, 2)) else [])
    for got, want in zip(together, alone):
        assert got["cispo"]["grad_norm"] == pytest.approx(want["cispo"]["grad_norm"], rel=1e-4)
        assert got["grpo"]["entropy_slope"] == pytest.approx(want["grpo"]["entropy_slope"], rel=1e-4, abs=1e-7)


def test_a_replicate_over_the_token_budget_runs_alone(tiny_model_dir, monkeypatch):
    policy, params, data, d = _setup(tiny_model_dir, PROMPTS)
    ps = ProbeSettings(("grpo", "cispo"), replicates=3, stale_prompts=1)
    monkeypatch.setattr(R, "PASS_TOKENS", 1)  # less than any replicate
    passes = _passes(monkeypatch)
    assert [len(p) for p in R._passes(data, R.replicate_rows(data, ps))] == [1, 1, 1]
    assert len(R.run_replicates(policy, params, data, d, ps, lambda n: None)) == 3 and passes == []
