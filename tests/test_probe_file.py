"""`thinkrl probe FILE`: a probe file names arms with their own parameters, trains its starting policy once,
and Holm-adjusts over the primary measures it declares; the rest are reported as secondary. Also the measures
the reproductions added: ict's JS scores (pi_old's, per replicate batch) and the per-unit-length entropy slope."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_cli_e2e import tiny_args
from test_probe import PROMPTS, samples
from tiny import tiny_lora_model
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.methods import get_method
from thinkrl.probe.measure import ProbeArm, directions
from thinkrl.probe.replicates import replicate
from thinkrl.probe.report import summarise
from thinkrl.probe.rollouts import Rollouts
from thinkrl.probe.spec import load_probe_file

TESTS = Path(__file__).parent


def _regime(tiny_model_dir) -> list[str]:
    args = tiny_args(tiny_model_dir, "unused")
    return [args[i + 1] for i, a in enumerate(args) if a == "-o" and "train.steps" not in args[i + 1]] + [f"model.name={tiny_model_dir}"]


@pytest.mark.plain
def test_a_probe_file_trains_its_start_once_and_adjusts_over_its_primary_measure(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))  # the length grader
    regime = _regime(tiny_model_dir)
    spec = {
        "name": "tiny",
        "start": [*regime, "train.steps=1"],
        "overrides": regime,
        "probe": {"replicates": 3, "stale_prompts": 2, "reference_prompts": 2},
        "arms": {"dapo": {"method": "dapo"}, "stare_on": {"method": "stare", "params": {"target_entropy": 50.0}}, "ict": {"method": "ict"}},
        "primary": ["entropy_slope"],
    }
    (tmp_path / "p.yaml").write_text(json.dumps(spec))
    result = CliRunner().invoke(app, ["probe", "p.yaml"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = tmp_path / "probes" / "tiny"
    assert (out / "start-0" / "checkpoints" / "step-1").is_dir() and "the starting policy: thinkrl train" in result.output
    report = json.loads((out / "probe.json").read_text())
    assert report["setting"]["arms"]["stare_on"] == {"method": "stare", "target_entropy": 50.0}
    assert report["primary"] == ["entropy_slope"] and set(report["methods"]) == {"dapo", "stare_on", "ict"}
    roles = {(c["method"], c["measure"]): c["role"] for c in report["comparisons"]}
    assert roles[("stare_on", "entropy_slope")] == roles[("ict", "entropy_slope")] == "primary"
    assert {r for (_, k), r in roles.items() if k != "entropy_slope"} == {"secondary"}
    secondary = [c for c in report["comparisons"] if c["role"] == "secondary"]
    assert all(c["p_holm"] is None and c["verdict"].startswith("secondary") and "Holm" not in c["verdict"] for c in secondary)
    # the gate is on (entropy under 50 nats): stare reweights, so its gradient is not dapo's
    assert any(r["stare_on"]["grad_norm"] != r["dapo"]["grad_norm"] for r in report["raw"][0])
    again = CliRunner().invoke(app, ["probe", "p.yaml"], catch_exceptions=False)  # the start is there: not trained again
    assert again.exit_code == 0 and "the starting policy" not in again.output


def test_holm_adjusts_over_the_primary_tests_alone():
    b = [{"entropy_slope": 0.1 + 0.01 * (i % 3), "cos_ref": 0.05 + 0.02 * (i % 2)} for i in range(8)]
    rows = [{"a": {"entropy_slope": 0.0, "cos_ref": 0.0}, "b": x} for x in b]
    one = summarise([rows], ["a", "b"], ("entropy_slope",))
    both = summarise([rows], ["a", "b"], ("entropy_slope", "cos_ref"))
    p = {c["measure"]: c for c in one["comparisons"]}
    assert p["entropy_slope"]["p_holm"] == pytest.approx(p["entropy_slope"]["p"])  # one primary test: nothing to adjust
    assert p["cos_ref"]["p_holm"] is None and p["cos_ref"]["role"] == "secondary"
    q = {c["measure"]: c["p_holm"] for c in both["comparisons"]}
    smaller, larger = sorted([p["entropy_slope"]["p"], p["cos_ref"]["p"]])
    assert sorted(q.values()) == pytest.approx([2 * smaller, max(2 * smaller, larger)])  # Holm: x2, then x1 (monotone)


def test_ict_reads_pi_olds_js_scores_and_the_unit_slope_is_the_slope_per_norm(tiny_model_dir):
    torch.manual_seed(0)
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(samples(policy, PROMPTS), policy, 0, 1.0)
    rows = torch.arange(len(PROMPTS) * 4)
    with pytest.raises(ValueError, match="ict needs batch.token_js"):
        replicate(policy, params, data, ["ict"], rows, directions(policy, params, data, None)[0])
    data.score_js(policy, Config(), get_method("ict"), [rows])
    together = data.old_js.clone()
    data.score_js(policy, Config(), get_method("ict"), [rows[:8], rows[8:]])
    mask = data.s.comp.mask
    assert data.old_js[mask].min() >= 0 and data.old_js[mask].max() <= torch.log(torch.tensor(2.0)) + 1e-6
    assert not torch.allclose(together, data.old_js)  # each replicate's batch is scored against its own mean
    d, _ = directions(policy, params, data, None)
    full = replicate(policy, params, data, [ProbeArm("all", "ict", (("frac", 1.0),)), "grpo"], rows[:8], d)
    # ict keeping every token is grpo's token-mean loss: the same gradient
    token_mean = replicate(policy, params, data, [ProbeArm("g", "grpo", (("aggregation", "token-mean"),))], rows[:8], d)["g"]
    assert full["all"]["grad_norm"] == pytest.approx(token_mean["grad_norm"], rel=1e-5)
    for r in full.values():
        assert r["entropy_slope_unit"] == pytest.approx(r["entropy_slope"] / r["grad_norm"])


def test_a_bad_probe_file_is_one_error_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arms: {a: {method: grpo}, b: {method: gspo}}\nprimary: [entropy]\n")
    with pytest.raises(UserError, match="primary must list one or more of entropy_slope"):
        load_probe_file(bad)
    bad.write_text("arms: {a: {method: grpo}, b: {method: gspo, params: 3}}\nprimary: [cos_ref]\n")
    with pytest.raises(UserError, match="arm b: params is a mapping"):
        load_probe_file(bad)
    bad.write_text("arms: {a: {method: grpo}, b: {method: gspo}}\nprimary: [cos_ref]\nprobe: {replicate: 3}\n")
    with pytest.raises(UserError, match="probe is a mapping of whole numbers over replicates"):
        load_probe_file(bad)
    result = CliRunner().invoke(app, ["probe", str(bad), "--methods", "grpo,gspo"])
    assert "--methods with a probe file" in str(result.exception)


def test_sis_gets_pi_olds_top_k_as_its_proposal_and_on_policy_accepts_within_it(tiny_model_dir):
    torch.manual_seed(0)
    policy = tiny_lora_model(tiny_model_dir)
    params = [p for p in policy.parameters() if p.requires_grad]
    data = Rollouts(samples(policy, PROMPTS), policy, 0, 1.0)
    data.record_topk(policy, 5)
    mask = data.s.comp.mask
    full = torch.cat([data.distribution(policy, rows) for rows in data.chunks()])  # (N, V) in the mask's row-major order
    top = full.topk(5, dim=-1)
    assert torch.equal(data.topk_ids[mask], top.indices) and torch.allclose(data.topk_old_logp[mask], top.values)
    rows = torch.arange(8)
    d, _ = directions(policy, params, data, None)
    # on-policy (theta1 = theta0, pi_old = the sampler) every ratio is 1: accepted tokens (weight 1) and rejected
    # ones (ratio 1) both give the gradient of log pi, so sis's gradient is grpo's; its draws repeat per replicate
    sis = ProbeArm("sis", "sis", (("k", 5),))
    once, twice = (replicate(policy, params, data, [sis, "grpo"], rows, d) for _ in range(2))
    assert once["sis"] == twice["sis"]
    assert once["sis"]["grad_norm"] == pytest.approx(once["grpo"]["grad_norm"], rel=1e-4)
    with pytest.raises(UserError, match="different K"):
        from thinkrl.probe.measure import ProbeSettings
        from thinkrl.probe.session import _starting_rollouts

        arms = (ProbeArm("a", "sis", (("k", 5),)), ProbeArm("b", "sis", (("k", 3),)))
        _starting_rollouts(data.s, policy, 0, Config(), ProbeSettings(arms, replicates=2), [a.build() for a in arms])
