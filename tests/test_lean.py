"""The lean engine (thinkrl/rollout/engines/lean.py, lean_decoder.py): the same tokens and log-probs as the
transformers forward (the reference loop), whatever the number of slots, on every architecture it takes; which
models take it. Slots and key/value storage: tests/test_lean_slots.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines.lean import lean_generate
from thinkrl.rollout.engines.lean_decoder import LeanDecoder
from thinkrl.rollout.engines.reference import reference_generate

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


def build_qwen3(bias: bool):
    """A tiny random Qwen3 (the same weights every call). Where it differs from Qwen2: RMSNorm on each query and
    key head before the rotary embedding (weights drawn away from 1, so a missing norm shows), q/k/v/o biases
    only when attention_bias, and a head_dim (16) that is not hidden_size / heads (8). Matrices are drawn at
    std 0.1, not the 0.02 init, so that greedy tokens follow the context instead of repeating one token."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=110,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attention_bias=bias,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
        for layer in model.model.layers:
            a = layer.self_attn
            a.q_norm.weight.uniform_(0.3, 3.0)
            a.k_norm.weight.uniform_(0.3, 3.0)
            for proj in (a.q_proj, a.k_proj, a.v_proj, a.o_proj) if bias else ():
                proj.bias.normal_(0, 0.1)
    return model


@pytest.fixture
def qwen3():
    return frozen(build_qwen3(bias=False))


@pytest.fixture
def qwen3_bias():
    return frozen(build_qwen3(bias=True))


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "qwen3_bias"])
@pytest.mark.parametrize("prompts", [PROMPTS, [PROMPTS[0], PROMPTS[0][::-1]]])  # different lengths, and one length
@pytest.mark.parametrize("slots", [0, 4, 1])  # all at once, refilled, one at a time
@pytest.mark.plain
def test_lean_decoding_matches_the_transformers_forward(request, name, prompts, slots):
    model = request.getfixturevalue(name)
    assert LeanDecoder.supports(model)
    sampling, eos = Sampling(12, 0.9, top_p=0.95), [1, 30, 31]
    ref = reference_generate(model, Request(prompts, 3, sampling, eos, 0, torch.Generator().manual_seed(3), 4, True))
    lean, stats = lean_generate(model, Request(prompts, 3, sampling, eos, 0, torch.Generator().manual_seed(3), 4, True), slots)
    assert ref.lengths.min() < 12 <= ref.lengths.max()  # some rows stopped early, others ran to the budget
    assert torch.equal(ref.tokens, lean.tokens) and torch.equal(ref.lengths, lean.lengths)
    assert torch.equal(ref.truncated, lean.truncated)
    for x, y in ((ref.behav_logp, lean.behav_logp), (ref.topk_logp, lean.topk_logp), (ref.entropy, lean.entropy)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
    assert torch.equal(ref.topk_ids[ref.mask], lean.topk_ids[lean.mask])
    assert stats["generate/slot_utilisation"] == 1.0  # with one slot per 16 refilled at once, never an empty slot


@pytest.mark.parametrize("name", ["qwen3", "qwen3_bias"])
@pytest.mark.plain
def test_qwen3_greedy_decoding_is_transformers_generate_token_for_token(request, name):
    """Three prompts of different lengths, two completions each, in 4 slots (refilled as rows finish): each
    row is what transformers' own greedy generate gives for its prompt alone."""
    model = request.getfixturevalue(name)
    assert LeanDecoder.supports(model)
    eos = [1, 30, 31]
    lean, _ = lean_generate(model, Request(PROMPTS, 2, Sampling(16, 0.0), eos, 0), slots=4)
    for r in range(lean.tokens.shape[0]):
        p = torch.tensor([PROMPTS[r // 2]])
        out = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=0)
        assert lean.tokens[r, : lean.lengths[r]].tolist() == out[0, p.shape[1] :].tolist()


@pytest.mark.plain
def test_qwen3_log_probs_are_the_transformers_forwards_and_the_trainers(qwen3):
    """Sampled rows (refilled slots): each token's log-prob is the transformers forward's over prompt +
    completion, and the trainer's log-probs (learner/logprobs.py) of the same Qwen3 with fresh LoRA adapters
    give the same values and a gradient for the adapters."""
    from thinkrl.config import LoraConfig
    from thinkrl.learner.logprobs import token_logprobs
    from thinkrl.models import add_lora

    comp, _ = lean_generate(qwen3, Request(PROMPTS, 2, Sampling(12, 1.0), [1], 0, torch.Generator().manual_seed(5)), slots=4)
    prompts = [PROMPTS[r // 2] for r in range(comp.tokens.shape[0])]
    for r, p in enumerate(prompts):
        ids = torch.tensor([p + comp.tokens[r, : comp.lengths[r]].tolist()])
        logp = torch.log_softmax(qwen3(ids).logits[0, len(p) - 1 : -1].float(), -1)  # (n, V) predicting each new token
        torch.testing.assert_close(comp.behav_logp[r, : comp.lengths[r]], logp.gather(1, ids[0, len(p) :, None])[:, 0], atol=1e-5, rtol=0)
    policy = add_lora(build_qwen3(bias=False), LoraConfig(rank=4, alpha=8))  # the trainee: same weights, B = 0
    out = token_logprobs(policy, prompts, comp.tokens, comp.mask, pad_id=0, temperature=1.0)
    torch.testing.assert_close(out.logp[comp.mask], comp.behav_logp[comp.mask], atol=1e-5, rtol=0)
    out.logp.sum().backward()
    assert any(bool(p.grad.abs().sum() > 0) for n, p in policy.named_parameters() if "lora_B" in n)


@pytest.mark.plain
def test_fused_weights_follow_in_place_writes(llama):
    """The sampler refreshes weights with copy_(); the fused matrices are views, so they see it."""
    lean = LeanDecoder.for_model(llama)
    assert LeanDecoder.for_model(llama) is lean  # built once per model
    with torch.no_grad():
        for layer in llama.model.layers:
            layer.self_attn.k_proj.weight.mul_(1.5)
            layer.mlp.up_proj.weight.add_(0.01)
    a = lean_generate(llama, Request(PROMPTS, 2, Sampling(6, 1.0), [1], 0, torch.Generator().manual_seed(0)))[0]
    b = reference_generate(llama, Request(PROMPTS, 2, Sampling(6, 1.0), [1], 0, torch.Generator().manual_seed(0)))
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.behav_logp, b.behav_logp, atol=1e-5, rtol=0)


def test_only_frozen_llama_shaped_models_take_the_lean_path(tiny_model_dir, llama):
    trainable = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not LeanDecoder.supports(trainable)  # the policy itself is never rewired
    comp, stats = lean_generate(trainable, Request(PROMPTS, 2, Sampling(5, 0.0), [1], 0))  # the reference loop instead
    assert comp.tokens.shape[0] == 6 and stats == {}
