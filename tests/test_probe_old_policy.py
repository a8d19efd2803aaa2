"""The probe with a sampler that is not the trainer (an fp8 copy): pi_old recomputed from the trainer's own
weights (old_policy: recompute), so mu != pi_old and ais's weights differ from 1; the reference gradient is
sampled at the trainer's precision whatever the sampler's."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_cli_e2e import tiny_args
from test_probe import PROMPTS, G
from tiny import tiny_lora_model
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.data.prompts import Prompt
from thinkrl.errors import UserError
from thinkrl.probe import session
from thinkrl.probe.measure import ProbeArm, ProbeSettings, directions
from thinkrl.probe.replicates import replicate
from thinkrl.probe.rollouts import Rollouts
from thinkrl.probe.spec import load_probe_file
from thinkrl.rollout.collect import StepSamples
from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import LeanEngine
from thinkrl.rollout.policy_copy import PolicySampler


def fp8_samples(policy) -> StepSamples:
    """G completions per prompt sampled by an fp8 copy of `policy` (behav_logp is the copy's), rewards varying."""
    fp8 = PolicySampler(policy, "fp8").refresh()
    comp = LeanEngine().generate(fp8, Request(PROMPTS, G, Sampling(6, 1.0), [1], 0, torch.Generator().manual_seed(0)))
    rewards = comp.lengths.float() + 0.1 * torch.arange(len(comp.lengths)) % G  # (B,)
    ps = [Prompt(str(i), "", "", "", ids) for i, ids in enumerate(PROMPTS)]
    return StepSamples(ps, comp, [""] * len(rewards), rewards, rewards, G)


@pytest.mark.plain
def test_recomputed_pi_old_is_the_trainers_log_prob_and_ais_weights_then_differ_from_one(tiny_model_dir):
    torch.manual_seed(0)
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(fp8_samples(policy), policy, 0, 1.0)
    assert data.mismatch_k3() == 0.0  # pi_old is the sampler until recomputed
    data.recompute_old(policy)
    mask = data.s.comp.mask
    rows = torch.arange(len(PROMPTS) * G)
    trainer = data.logprobs(policy, rows).logp.detach()  # (B, T')
    assert torch.allclose(data.old_logp[:, : trainer.shape[1]][mask[:, : trainer.shape[1]]], trainer[mask[:, : trainer.shape[1]]])
    assert not torch.allclose(data.old_logp[mask], data.s.comp.behav_logp[mask], atol=1e-4)  # fp8 moved mu
    k3 = data.mismatch_k3()
    log_rho = (data.old_logp - data.s.comp.behav_logp)[mask].double()
    assert k3 > 0 and k3 == pytest.approx(float((log_rho.exp() - 1 - log_rho).mean()))
    d, _ = directions(policy, params, data, None)
    arms = ["grpo", ProbeArm("ais0", "ais", (("alpha", 0.0),)), ProbeArm("ais1", "ais", (("alpha", 1.0),))]
    out = replicate(policy, params, data, arms, rows, d)
    assert out["ais0"]["grad_norm"] == pytest.approx(out["grpo"]["grad_norm"], rel=1e-5)  # alpha 0: uncorrected grpo
    assert out["ais1"]["grad_norm"] != pytest.approx(out["grpo"]["grad_norm"], rel=1e-4)  # weights min(pi_old / mu, 2)
    adaptive = replicate(policy, params, data, ["grpo", "ais"], rows, d)["ais"]["metrics"]
    assert adaptive["ais/alpha"] == adaptive["ais/alpha_batch"]  # begin_step's alpha for this batch, kept per replicate
    assert out["ais1"]["metrics"]["ais/alpha"] == 1.0 and "ais/weight_mean" in out["ais1"]["metrics"]


def test_the_reference_is_sampled_at_the_trainers_precision(tiny_model_dir, monkeypatch):
    policy = tiny_lora_model(tiny_model_dir)
    seen = []

    def fake_groups(ctx, order, want, seed, device, stream=0):
        seen.append(ctx.sampler.precision)
        return "fresh", 0

    monkeypatch.setattr(session, "_groups_with_spread", fake_groups)

    ctx = dataclasses.make_dataclass("C", [("sampler", object)])(PolicySampler(policy, "fp8"))
    assert session._reference(ctx, policy, [], ProbeSettings(("grpo", "gspo")), "cpu") == "fresh"
    assert seen == ["same"] and ctx.sampler.precision == "fp8"  # the replicates' sampler is left as it was


def test_a_bad_old_policy_names_the_value_and_the_choices(tmp_path):
    with pytest.raises(UserError, match="old_policy 'stale': choose sampler or recompute"):
        ProbeSettings(("grpo", "gspo"), old_policy="stale")
    bad = tmp_path / "bad.yaml"
    bad.write_text("arms: {a: {method: grpo}, b: {method: ais}}\nprimary: [cos_ref]\nprobe: {old_policy: fresh}\n")
    with pytest.raises(UserError, match="old_policy 'fresh': choose sampler or recompute"):
        load_probe_file(bad)
    bad.write_text("arms: {a: {method: grpo}, b: {method: ais}}\nprimary: [cos_ref]\nprobe: {old_policy: recompute, replicates: 300}\n")
    assert load_probe_file(bad).probe_settings(replicates=None).old_policy == "recompute"
    result = CliRunner().invoke(app, ["probe", "--old-policy", "trainer"])
    assert "--old-policy 'trainer': choose sampler or recompute" in str(result.exception)


@pytest.mark.plain
def test_a_probe_with_an_fp8_sampler_and_a_recomputed_pi_old_reports_their_mismatch(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = tiny_args(tiny_model_dir, tmp_path / "unused")
    overrides = [x for i, a in enumerate(shared) if a == "-o" and "train.steps" not in shared[i + 1] for x in ("-o", shared[i + 1])]
    args = ["probe", "--model", str(tiny_model_dir), "--methods", "grpo,ais", "--replicates", "2", "--stale-prompts", "2"]
    args += ["--stale-updates", "0", "--reference-prompts", "2", "-o", "rollout.precision=fp8", *overrides]
    runs = {}
    for old in ("sampler", "recompute"):
        result = CliRunner().invoke(app, [*args, "--old-policy", old, "--output", old], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        runs[old] = json.loads((tmp_path / old / "probe.json").read_text())
    assert runs["sampler"]["begins"][0]["sampler_k3"] == 0 < runs["recompute"]["begins"][0]["sampler_k3"]
    # the same output directory under other settings: its start record is refused, not mixed in
    result = CliRunner().invoke(app, [*args, "--old-policy", "recompute", "--output", "sampler"])
    assert "sampler/start-0.json was measured with other inputs" in str(result.exception)
    assert runs["recompute"]["setting"]["old_policy"] == "recompute"
