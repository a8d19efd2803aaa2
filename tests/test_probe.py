"""`thinkrl probe`: one update of each method on independent replicates. The measures are checked against what
they claim: the cosine is 1 where a method's gradient is the reference's own, the entropy slope is the
first-order change of the entropy under a real step, and the command writes paired, adjusted comparisons."""

from __future__ import annotations

import json

import pytest
import torch
from test_cli_e2e import tiny_args
from tiny import tiny_lora_model
from typer.testing import CliRunner

from thinkrl.accel.packed import can_pack
from thinkrl.cli import app
from thinkrl.data.prompts import Prompt
from thinkrl.errors import UserError
from thinkrl.learner import method_calls
from thinkrl.methods import get_method
from thinkrl.probe.measure import Directions, check_method, directions, flat_grad, kl_from_start, reference, weights
from thinkrl.probe.replicates import replicate
from thinkrl.probe.rollouts import Rollouts
from thinkrl.rollout.collect import StepSamples
from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import LeanEngine

G = 4


def samples(policy, prompts: list[list[int]], seed: int = 0) -> StepSamples:
    """G completions per prompt sampled by `policy`, with rewards that vary within every group (length)."""
    comp = LeanEngine().generate(policy, Request(prompts, G, Sampling(6, 1.0), [1], 0, torch.Generator().manual_seed(seed)))
    rewards = comp.lengths.float() + 0.1 * torch.arange(len(comp.lengths)) % G  # (B,), a spread in every group
    ps = [Prompt(str(i), "", "", "", ids) for i, ids in enumerate(prompts)]
    return StepSamples(ps, comp, [""] * len(rewards), rewards, rewards, G)


PROMPTS = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 5], [4, 9, 10, 11, 12], [4, 30, 31, 32, 33]]


def test_on_policy_grpo_points_exactly_along_the_reference_gradient(tiny_model_dir):
    """On the reference's own rollouts, with no stale step, grpo's loss is minus the REINFORCE objective the
    reference differentiates (every ratio 1, no clip, the same advantages and aggregation): cosine 1."""
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(samples(policy, PROMPTS), policy, 0, 1.0)
    d, kl = directions(policy, params, data, None)
    out = replicate(policy, params, data, ["grpo", "gspo"], torch.arange(len(PROMPTS) * G), d)
    g_ref = d.g_ref
    assert out["grpo"]["cos_ref"] == pytest.approx(1.0, abs=1e-5)
    assert out["gspo"]["cos_ref"] == pytest.approx(1.0, abs=1e-5)  # on-policy, gspo's sequence ratio is 1 too
    assert out["grpo"]["grad_norm"] == pytest.approx(float(g_ref.norm()), rel=1e-4)
    assert kl == 0 and out["grpo"]["kl_slope"] == 0  # no stale step: the policy is the starting one


def moved_start(tiny_model_dir, prompts: list[list[int]]):
    """The tiny LoRA policy, its rollouts of `prompts` (theta0 samples them) and theta0's weights, with the
    policy then moved a fixed random step away (theta1): (policy, params, rollouts, theta0)."""
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(samples(policy, prompts), policy, 0, 1.0)
    theta0 = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return policy, params, data, theta0


def step(params: list[torch.Tensor], g: torch.Tensor, lr: float) -> None:
    """theta -> theta - lr * g, in place."""
    with torch.no_grad():
        offset = 0
        for p in params:
            p.sub_(lr * g[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def test_the_entropy_slope_is_the_first_order_change_of_a_real_step(tiny_model_dir):
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(samples(policy, PROMPTS), policy, 0, 1.0)
    ref = Rollouts(samples(policy, PROMPTS, seed=1), policy, 0, 1.0)
    g_ref, g_h = reference(policy, params, ref)
    rows = torch.arange(G)  # one group
    d = Directions(g_ref, g_h, torch.zeros_like(g_ref))
    slope = replicate(policy, params, data, ["cispo"], rows, d)["cispo"]["entropy_slope"]
    lp = data.logprobs(policy, rows)
    loss, _ = method_calls.loss(get_method("cispo"), data.batch(get_method("cispo"), rows, lp.logp, None))
    g = flat_grad(loss, params, retain=False)

    def mean_entropy() -> float:
        with torch.no_grad():
            parts = [ref.logprobs(policy, r, entropy=True) for r in ref.chunks()]
            mask = ref.s.comp.mask
            return float(sum((p.entropy * mask[r, : p.entropy.shape[1]]).sum() for p, r in zip(parts, ref.chunks())) / mask.sum())

    before, lr = mean_entropy(), 1e-2
    step(params, g, lr)
    after = mean_entropy()
    assert slope != 0 and (after - before) / lr == pytest.approx(slope, rel=0.05)


def test_the_renyi2_slope_is_the_first_order_change_of_the_renyi2_entropy_under_a_real_step(tiny_model_dir):
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(samples(policy, PROMPTS), policy, 0, 1.0)
    ref = Rollouts(samples(policy, PROMPTS, seed=1), policy, 0, 1.0)
    d, _ = directions(policy, params, ref, None, renyi=True)
    rows = torch.arange(G)
    slope = replicate(policy, params, data, ["cispo"], rows, d)["cispo"]["renyi2_slope"]
    lp = data.logprobs(policy, rows)
    loss, _ = method_calls.loss(get_method("cispo"), data.batch(get_method("cispo"), rows, lp.logp, None))
    g = flat_grad(loss, params, retain=False)

    def mean_renyi2() -> float:  # -log sum p^2 per generated position, averaged: written out, not the probe's code
        with torch.no_grad():
            total = 0.0
            for r in ref.chunks():
                logp = ref.distribution(policy, r)  # (n, V) at the masked positions
                total += float((-(logp.exp() ** 2).sum(-1).log()).sum())
            return total / float(ref.s.comp.mask.sum())

    before, lr = mean_renyi2(), 1e-2
    step(params, g, lr)
    after = mean_renyi2()
    assert slope != 0 and (after - before) / lr == pytest.approx(slope, rel=0.05)


def test_the_kl_slope_is_the_first_order_change_of_the_kl_from_the_start_under_a_real_step(tiny_model_dir):
    """theta1 a step away from theta0 (the sampler); the update's kl_slope predicts how KL(theta0 || theta)
    over the reference positions changes along theta1 - lr * g, and the KL itself is that of a plain
    full-vocabulary computation."""
    policy, params, data, theta0 = moved_start(tiny_model_dir, PROMPTS)
    ref = Rollouts(samples(policy, PROMPTS, seed=1), policy, 0, 1.0)
    d, kl = directions(policy, params, ref, theta0)
    rows = torch.arange(G)
    slope = replicate(policy, params, data, ["grpo"], rows, d)["grpo"]["kl_slope"]
    lp = data.logprobs(policy, rows)
    loss, _ = method_calls.loss(get_method("grpo"), data.batch(get_method("grpo"), rows, lp.logp, None))
    g = flat_grad(loss, params, retain=False)
    with torch.no_grad():  # the KL by hand: both distributions over every position, then the mean
        mask = ref.s.comp.mask
        logq = torch.cat([ref.distribution(policy, r) for r in ref.chunks()])
        with weights(params, theta0):
            logp = torch.cat([ref.distribution(policy, r) for r in ref.chunks()])
    assert logq.shape[0] == int(mask.sum()) and kl > 0
    assert kl == pytest.approx(float((logp.exp() * (logp - logq)).sum(-1).mean()), rel=1e-4)
    lr = 1e-2
    step(params, g, lr)
    after = kl_from_start(policy, params, ref, theta0)[1]
    assert slope != 0 and (after - kl) / lr == pytest.approx(slope, rel=0.05)


def test_a_method_whose_loss_reads_what_the_probe_does_not_build_is_refused():
    with pytest.raises(UserError, match="cannot probe thinking_seeds: its loss reads prefix_mask"):
        check_method(get_method("thinking_seeds"))
    check_method(get_method("stapo"))  # entropy: built
    check_method(get_method("sis"))  # pi_old's top-K: built (tests/test_probe_file.py)


@pytest.mark.plain
def test_the_probe_command_writes_paired_adjusted_comparisons(tiny_model_dir, tmp_path, monkeypatch):
    import thinkrl.accel.fused_lora as fused

    monkeypatch.chdir(tmp_path)
    packed_t = []  # per LoRA input gradient: through a packed W^T? (the probe asks for it; training does not)
    plain_input_grad = fused.input_grad
    monkeypatch.setattr(fused, "input_grad", lambda g, w, wt: (packed_t.append(wt is not None), plain_input_grad(g, w, wt))[1])
    shared = tiny_args(tiny_model_dir, tmp_path / "unused")
    overrides = [x for i, a in enumerate(shared) if a == "-o" and "train.steps" not in shared[i + 1] for x in ("-o", shared[i + 1])]
    args = ["probe", "--model", str(tiny_model_dir), "--methods", "grpo,gspo,cispo", "--replicates", "3", "--stale-prompts", "2"]
    result = CliRunner().invoke(app, [*args, "--reference-prompts", "2", "--output", "out", *overrides], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert report["replicates"] == [3] and len(report["raw"][0]) == 3 and set(report["methods"]) == {"grpo", "gspo", "cispo"}
    measures = ["entropy_slope", "cos_ref", "kl_slope", "grad_norm", "clip_frac"]
    assert [(c["method"], c["measure"]) for c in report["comparisons"]][:5] == [("gspo", k) for k in measures]
    assert report["begins"][0]["kl_start_to_probed"] > 0 and report["begins"][0]["log_ratio_sd"] > 0  # two stale steps moved it
    assert report["level"] == "replicate" and all(c["unit"] == "replicates of one start" for c in report["comparisons"])
    assert all(c["baseline"] == "grpo" and "p_holm" in c for c in report["comparisons"])
    assert "## Paired differences" in (tmp_path / "out" / "probe.md").read_text()
    assert "probe: out/probe.md" in result.output
    assert "more with a reward spread (round 1)" in result.output  # the silent minutes of sampling say what they are
    if can_pack(torch.zeros(2, 2)):  # stale steps, reference and replicates: every backward through the packed W^T
        assert packed_t and all(packed_t)
    else:  # THINKRL_ACCEL=0 or no oneDNN: plain peft layers, no packed W^T
        assert not any(packed_t)


def test_bad_probe_flags_fail_in_one_line():
    runner = CliRunner()
    result = runner.invoke(app, ["probe", "--methods", "grpo"])
    assert result.exit_code != 0 and "name two or more distinct methods" in str(result.exception)
    result = runner.invoke(app, ["probe", "--replicates", "1"])
    assert "--replicates 1: must be >= 2" in str(result.exception)
