"""thinkrl/rollout/engines/lean_decoder.py decodes exactly what the transformers forward decodes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from thinkrl.rollout.completions import Sampling
from thinkrl.rollout.engines.lean import generate
from thinkrl.rollout.engines.lean_decoder import LeanDecoder

PROMPTS = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 73, 74, 75, 76, 5], [9, 9, 8]]  # lengths 5, 9, 3: left padding


def frozen(model):
    return model.eval().requires_grad_(False)


@pytest.fixture
def llama(tiny_model_dir):
    return frozen(AutoModelForCausalLM.from_pretrained(tiny_model_dir))


@pytest.fixture
def qwen2():
    """Qwen2's shape differs from Llama's where it matters here: biases on q, k and v."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=110,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # random, not zero, biases
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return frozen(model)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("prompts", [PROMPTS, [PROMPTS[0], PROMPTS[0][::-1]]])  # padded, and one length (no mask)
def test_lean_decoding_matches_the_transformers_forward(request, name, prompts):
    model = request.getfixturevalue(name)
    assert LeanDecoder.supports(model)

    def run(lean: bool):
        sampling, gen = Sampling(12, 0.9, top_p=0.95), torch.Generator().manual_seed(3)
        return generate(model, prompts, 3, sampling, [1, 30, 31], 0, gen, record_topk=4, record_entropy=True, lean=lean)

    a, b = run(True), run(False)
    assert a.lengths.min() < 12 < a.lengths.max() + 1  # some rows stopped early and left the batch
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
    for x, y in ((a.behav_logp, b.behav_logp), (a.topk_logp, b.topk_logp), (a.entropy, b.entropy)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_fused_weights_follow_in_place_writes(llama):
    """The sampler refreshes weights with copy_(); the fused matrices are views, so they see it."""
    lean = LeanDecoder.for_model(llama)
    assert LeanDecoder.for_model(llama) is lean  # built once per model
    with torch.no_grad():
        for layer in llama.model.layers:
            layer.self_attn.k_proj.weight.mul_(1.5)
            layer.mlp.up_proj.weight.add_(0.01)
    run = lambda lean: generate(llama, PROMPTS, 2, Sampling(6, 1.0), [1], 0, torch.Generator().manual_seed(0), lean=lean)  # noqa: E731
    a, b = run(True), run(False)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.behav_logp, b.behav_logp, atol=1e-5, rtol=0)


def test_only_frozen_llama_shaped_models_take_the_lean_path(tiny_model_dir, llama):
    trainable = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not LeanDecoder.supports(trainable)  # the policy itself is never rewired
    llama.config.hidden_act = "gelu"
    assert not LeanDecoder.supports(llama)
