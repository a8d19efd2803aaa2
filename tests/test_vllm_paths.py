"""The vLLM engine (make test-vllm) on what a GPU runs: bfloat16 weights with the CPU speed-ups off, and each
family of tests/families.py.

A GPU trains in bfloat16 (model.dtype auto) and its vLLM samples in the trainer's dtype (rollout.precision
same); the rest of the vLLM suite runs float32. Each family trains two steps with vLLM sampling, which loads
the family's checkpoint into vLLM and pushes the merged LoRA weights into it (the run's mismatch/* and the
agreement check compare vLLM's log-probs with the trainer's own), then evaluates the run on vLLM. Skipped where vLLM does not import.
"""

from __future__ import annotations

import math

import pytest
import torch
from families import FAMILIES, build_family
from test_cli_e2e import invoke, tiny_args
from test_engines import _ENGINES, HAS_VLLM

from thinkrl.evaluation import evaluate
from thinkrl.models import resolve_dtype
from thinkrl.run.jsonl import read_jsonl

BUDGET = ["-o", "rollout.max_new_tokens=6", "-o", "rollout.group_size=2", "-o", "train.micro_batch_size=4"]


@pytest.fixture
def vllm_dtypes(monkeypatch):
    """The dtype each vLLM engine started in this test runs (vLLM's own model config); the engines that other
    tests keep open are closed first: a second vLLM in this process needs the first one's memory."""
    from thinkrl.rollout.engines.vllm import VLLMEngine

    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()
    started: list[torch.dtype] = []
    start = VLLMEngine._start

    def recorded(self, model):
        start(self, model)
        started.append(self.llm.model_config.dtype)

    monkeypatch.setattr(VLLMEngine, "_start", recorded)
    return started


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
def test_train_and_eval_in_bfloat16_on_vllm(tmp_path, monkeypatch, vllm_dtypes):
    from tiny import build_tiny_model

    monkeypatch.setenv("THINKRL_ACCEL", "0")
    model_dir, out = build_tiny_model(tmp_path / "model", heads=2, head_dim=32), tmp_path / "run"
    said = invoke(tiny_args(model_dir, out, 2, "-o", "rollout.engine=vllm", "-o", "model.dtype=bfloat16")).output
    assert "on cpu in float32 masters, bfloat16 compute, bfloat16 frozen base" in said, said
    assert "sampling: engine vllm (set by rollout.engine): vLLM" in said, said
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics), metrics
    assert all(m["mismatch/abs_log_ratio"] < 0.01 for m in metrics), metrics  # both bfloat16 (~1e-3 here), different kernels
    # eval as a GPU loads the run: auto is bfloat16, and vLLM samples the merged model in it
    monkeypatch.setattr(
        evaluate, "resolve_dtype", lambda dtype, device: torch.bfloat16 if dtype == "auto" else resolve_dtype(dtype, device)
    )
    said = invoke(["eval", "--model", str(out), "--limit", "4", "--max-new-tokens", "4", "--engine", "vllm"]).output
    assert "sampling: engine vllm (set by --engine): vLLM" in said, said
    assert len(read_jsonl(out / "eval" / "step-2" / "arith" / "samples.jsonl")) == 4
    assert vllm_dtypes == [torch.bfloat16, torch.bfloat16]


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_and_evaluates_with_vllm(family, tmp_path, vllm_dtypes):
    out = tmp_path / "run"
    said = invoke(tiny_args(build_family(family, tmp_path / "model"), out, 2, "-o", "rollout.engine=vllm", *BUDGET)).output
    assert "sampling: engine vllm (set by rollout.engine): vLLM" in said, said
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(math.isfinite(m["loss"]) for m in metrics), metrics
    assert all(m["mismatch/abs_log_ratio"] < 1e-3 for m in metrics), metrics  # float32: vLLM's log-probs are the trainer's
    assert metrics[0]["mismatch/agreement_gap"] < 1e-3 and "sampler and trainer disagree" not in said  # checked, passed
    said = invoke(["eval", "--model", str(out), "--limit", "2", "--max-new-tokens", "4", "--engine", "vllm"]).output
    assert "sampling: engine vllm (set by --engine): vLLM" in said, said
    assert len(read_jsonl(out / "eval" / "step-2" / "arith" / "samples.jsonl")) == 2
    assert vllm_dtypes == [torch.float32, torch.float32]


@pytest.mark.parametrize("head", [False, True], ids=["vllm-model-without-lm_head", "vllm-model-with-lm_head"])
def test_a_tied_weight_is_pushed_under_the_names_vllm_has(head, tmp_path):
    """Gemma-2 ties lm_head to the embeddings; vLLM's Gemma-2 has no lm_head and refuses the name, its Llama has
    one and needs it. The push sends a tied weight under each name vLLM's model has (no vLLM needed: the
    engine's vLLM is a stand-in that keeps what it is given)."""
    from transformers import AutoModelForCausalLM

    from thinkrl.rollout.engines.vllm import VLLMEngine

    class Stand:
        def collective_rpc(self, method, kwargs):
            self.pushed = [name for name, _ in kwargs["weights_iterator"]]

        def reset_prefix_cache(self):
            pass

    model = AutoModelForCausalLM.from_pretrained(build_family("gemma2", tmp_path))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    engine = VLLMEngine(4)
    engine.llm, names = Stand(), set(model.state_dict())
    engine._names = names if head else names - {"lm_head.weight"}
    engine._push(model)
    assert engine.llm.pushed == [n for n in model.state_dict() if head or n != "lm_head.weight"]
