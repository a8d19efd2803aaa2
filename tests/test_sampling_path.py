"""The sampling path a run names (engines.describe_path): the engine, how it was chosen, and for lean whether the
fused decoder or the reference loop decodes the model and why; the startup output of train and eval and their
records say it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from thinkrl.rollout.engines import make_engine


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """The tiny Llama (tests/tiny.py), frozen as a sampling copy is."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval().requires_grad_(False)


def _tiny(config_cls, model_cls, **changes):
    """A tiny frozen random model of another architecture, built from its config (no hub)."""
    config = config_cls(
        vocab_size=110,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **changes,
    )
    return model_cls(config).eval().requires_grad_(False)


def test_the_sampling_path_names_the_fused_decoder_for_a_llama(model):
    from thinkrl.rollout.engines import describe_path

    path = describe_path(make_engine("auto", torch.device("cpu"), 8, 64), model)
    assert path.line() == "engine lean (auto on a CPU): fused decoder"
    assert path.record() == {"engine": "lean", "chosen": "auto on a CPU", "decoder": "fused decoder", "why": ""}
    said = describe_path(make_engine("transformers", torch.device("cpu"), 8, 64, "--engine"), model).line()
    assert said == "engine transformers (set by --engine): transformers' paged continuous batching"


@pytest.mark.parametrize(
    ("arch", "changes", "reason"),
    [
        ("starcoder2", {}, "Starcoder2ForCausalLM is not in the lean decoder (it covers LlamaForCausalLM, "),
        ("mistral", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_type dynamic (its tables"),
        ("qwen3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "partial_rotary"),
        ("llama", {"hidden_act": "gelu"}, "activation gelu (it runs silu or gelu_pytorch_tanh)"),
        ("llama", {"mlp_bias": True}, "mlp_bias=True (it runs MLPs without biases)"),
        ("llama", {"pretraining_tp": 2}, "pretraining_tp=2 (it runs 1)"),
    ],
)
def test_the_sampling_path_names_why_the_reference_loop_decodes(arch, changes, reason):
    """Under rollout.engine=auto on a CPU a model the lean decoder does not cover goes through the reference
    loop: the description says so, names the condition it fails, and the engine that batches any architecture."""
    import transformers

    from thinkrl.rollout.engines import describe_path

    names = {"llama": "Llama", "mistral": "Mistral", "qwen3": "Qwen3", "starcoder2": "Starcoder2"}
    classes = {k: (getattr(transformers, f"{v}Config"), getattr(transformers, f"{v}ForCausalLM")) for k, v in names.items()}
    path = describe_path(make_engine("auto", torch.device("cpu"), 8, 64), _tiny(*classes[arch], **changes))
    assert path.decoder == "reference loop" and reason in path.why
    assert path.line().startswith("engine lean (auto on a CPU): reference loop, ")
    assert path.why.endswith("; rollout.engine=transformers batches any architecture continuously")
    assert "frozen" not in path.why  # the model is a frozen sampling copy: that condition holds


def test_the_sampling_path_of_qwen3_follows_the_lean_decoder_architectures():
    """A tiny Qwen3 (no sliding window): the fused decoder once Qwen3ForCausalLM is in SUPPORTED, else the
    reference loop naming the architecture as the one failed condition."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from thinkrl.rollout.engines import describe_path
    from thinkrl.rollout.engines.lean_decoder import SUPPORTED

    path = describe_path(make_engine("lean", torch.device("cpu"), 8, 64), _tiny(Qwen3Config, Qwen3ForCausalLM))
    if "Qwen3ForCausalLM" in SUPPORTED:
        assert path.line() == "engine lean (set by rollout.engine): fused decoder"
    else:
        assert path.why.startswith("Qwen3ForCausalLM is not in the lean decoder (it covers LlamaForCausalLM, Qwen2ForCausalLM")
        assert path.why.count(";") == 1  # the architecture, then the hint: nothing else failed


def test_the_sampling_path_says_when_the_trained_policy_itself_is_sampled(tiny_model_dir):
    """Full fine-tuning at rollout.precision=same samples with the trainee, which the lean decoder never
    rewires: the reference loop, and that is the reason given."""
    from thinkrl.rollout.engines import describe_path

    trainee = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    path = describe_path(make_engine("lean", torch.device("cpu"), 8, 64), trainee)
    assert path.decoder == "reference loop"
    assert path.why.startswith("it samples with the trained policy itself, not a frozen copy (full fine-tuning, rollout.precision=same)")


@pytest.mark.plain
def test_train_and_eval_say_and_record_their_sampling_path(tiny_model_dir, tmp_path):
    """The startup output of train and eval names the resolved engine and decoder; config.yaml keeps
    rollout.engine=auto as written, data_report.json and eval's settings.json record the path."""
    import json

    import yaml
    from test_cli_e2e import invoke, tiny_args

    out, dest = tmp_path / "run", tmp_path / "eval"
    said = invoke(tiny_args(tiny_model_dir, out, 1)).output
    assert "sampling: engine lean (auto on a CPU): fused decoder" in said  # LoRA: a merged, frozen sampling copy
    assert yaml.safe_load((out / "config.yaml").read_text())["rollout"]["engine"] == "auto"
    recorded = json.loads((out / "data_report.json").read_text())["sampling"]
    assert recorded == {"engine": "lean", "chosen": "auto on a CPU", "decoder": "fused decoder", "why": ""}
    said = invoke(["eval", "--model", str(out), "--limit", "2", "--max-new-tokens", "4", "--output", str(dest)]).output
    assert "sampling: engine lean (auto on a CPU): fused decoder" in said
    settings = json.loads((dest / "settings.json").read_text())
    assert settings["engine"] == "auto" and settings["sampling"]["decoder"] == "fused decoder"
