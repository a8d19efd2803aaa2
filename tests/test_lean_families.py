"""The lean decoder on the families beyond Llama/Qwen (lean_family.py): tiny random models with each family's
distinguishing features switched on (sliding windows shorter than the generated rows, post-norms, whole-q/k
norms, Gemma's 1 + w norms, query_pre_attn_scalar, per-layer-type rotary tables, logit soft-capping) decode
greedily what transformers' generate decodes, and sample with the transformers forward's log-probs."""

from __future__ import annotations

import pytest
import torch
import transformers

from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import lean_decoder
from thinkrl.rollout.engines.lean import lean_generate
from thinkrl.rollout.engines.lean_decoder import LeanDecoder

PROMPTS = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 73, 74, 75, 76, 5], [9, 9, 8]]  # the 9-token one is longer than the window
WINDOW = 6
NEW = 32  # new tokens per row: at least 24 past the window
SHAPE = dict(
    vocab_size=120,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,  # rows run to the budget in both decoders
)
# architecture: (config class, model class, the family's features switched on)
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    # layer 0 full attention, layer 1 sliding (max_window_layers): a window on some layers only
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "qwen3_window": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, head_dim=16),
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(attention_bias=True)),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24,  # not head_dim: a 1 / sqrt(D) scale shows
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},  # the local base, far from the global one
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=WINDOW,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,  # small caps: most scores and logits are squashed
            final_logit_softcapping=2.0,
        ),
    ),
}


def build(name: str, **changes):
    """A tiny random model of family `name` (the same weights every call). Matrices at std 0.1, not the 0.02
    init, so that greedy tokens follow the context; every norm weight drawn away from its identity, so a
    norm applied in the wrong place or convention shows; biases random."""
    config_cls, model_cls, features = FAMILIES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**{**SHAPE, **features, **changes})
    model = getattr(transformers, model_cls)(config)
    gemma = name.startswith("gemma")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
            elif "norm" in n:
                p.uniform_(-0.5, 1.0) if gemma else p.uniform_(0.5, 2.0)  # Gemma applies 1 + w
            else:
                p.normal_(0, 0.1)  # biases
    return model.eval().requires_grad_(False)


def greedy_rows(model, slots: int):
    """Lean's greedy rows (3 prompts x 2, refilled slots) and transformers' greedy generate for each prompt."""
    lean, _ = lean_generate(model, Request(PROMPTS, 2, Sampling(NEW, 0.0), [], 0), slots=slots)
    theirs = []
    for r in range(lean.tokens.shape[0]):
        p = torch.tensor([PROMPTS[r // 2]])
        out = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        theirs.append(out[0, p.shape[1] :].tolist())
    return [lean.tokens[r, : lean.lengths[r]].tolist() for r in range(lean.tokens.shape[0])], theirs


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "sdpa"])
@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.plain
def test_greedy_decoding_is_transformers_generate_token_for_token(name, kernel, monkeypatch):
    """Every row NEW tokens long (far past the window), token for token transformers' greedy generate, with
    the C kernel where it applies (windows not yet binding, no soft-cap) and with SDPA everywhere."""
    if not kernel:
        monkeypatch.setattr(lean_decoder.accel, "decode_attention_usable", lambda keys: False)
    model = build(name)
    assert LeanDecoder.supports(model), LeanDecoder.why_not(model)
    ours, theirs = greedy_rows(model, slots=4)
    assert all(len(row) == NEW for row in ours)
    assert ours == theirs


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.plain
def test_sampled_log_probs_are_the_transformers_forwards(name):
    """Sampled rows (refilled slots): each token's behaviour log-prob is the transformers forward's over prompt +
    completion (the model's own logits: Gemma-2's final soft-cap included)."""
    model = build(name)
    comp, _ = lean_generate(model, Request(PROMPTS, 2, Sampling(NEW, 1.0), [], 0, torch.Generator().manual_seed(5)), slots=4)
    assert bool((comp.lengths == NEW).all())
    for r in range(comp.tokens.shape[0]):
        p = PROMPTS[r // 2]
        ids = torch.tensor([p + comp.tokens[r].tolist()])
        logp = torch.log_softmax(model(ids).logits[0, len(p) - 1 : -1].float(), -1)  # (NEW, V) predicting each new token
        torch.testing.assert_close(comp.behav_logp[r], logp.gather(1, ids[0, len(p) :, None])[:, 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("mistral", dict(sliding_window=None)),  # the same model without its window
        ("gemma2", dict(attn_logit_softcapping=None)),
        ("gemma2", dict(final_logit_softcapping=None)),
        ("gemma3", dict(layer_types=["full_attention", "full_attention"])),
    ],
)
def test_the_features_change_the_models_log_probs(name, changes):
    """The configs above are ones where each feature matters: without it, transformers' log-probs over a
    sequence longer than the window move far beyond the tolerance of the log-prob test above (so a decoder that
    ignored the feature would fail it)."""
    ids = torch.tensor([PROMPTS[1] + list(range(10, 10 + NEW))])
    with_it, without = (torch.log_softmax(build(name, **c)(ids).logits.float(), -1) for c in ({}, changes))
    assert (with_it - without).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("name", "changes", "reason"),
    [
        ("phi3", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5 (it rotates whole heads)"),
        ("mistral", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), "rope_type dynamic"),
        ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True (it runs causal attention)"),
        ("olmo2", dict(hidden_act="gelu"), "activation gelu (it runs silu or gelu_pytorch_tanh)"),
    ],
)
def test_what_the_fused_loop_does_not_run_is_named(name, changes, reason):
    model = build(name, **changes)
    assert not LeanDecoder.supports(model) and reason in LeanDecoder.why_not(model)
