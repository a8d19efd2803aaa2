"""Tiny random models of the families thinkrl is expected to train, built offline from configs, each saved with
the tiny character tokenizer (tests/tiny.py) so `--model DIR` loads it.

One shape for all (2 layers, 2 query heads of 32 with 1 key/value head, hidden 64, MLP 128, 512 positions):
vLLM's CPU attention kernels need heads of at least 32. Each config keeps what makes its family differ:
Qwen2's qkv biases, Qwen3's q/k norms, Llama-3.2's llama3 rope scaling and tied embeddings, a Mistral window
shorter than a prompt, Gemma-2's soft-capping and alternating windows, Gemma-3's text model with per-layer-type
rope, Phi-3's fused qkv and gate/up projections. Used by tests/test_families_e2e.py and the vLLM suite.
"""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("qwen2", "qwen3", "llama3.2", "mistral", "gemma2", "gemma3", "phi3")
WINDOW = 16  # shorter than any arith prompt in the chat template (the character tokenizer: about 50 tokens)
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=512,
)
ALTERNATING = ["sliding_attention", "full_attention"]


def _config(name: str, ids: dict):
    """The family's model class and config; `ids` carries the tokenizer's vocab size and special ids."""
    import transformers as t

    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    gemma = dict(query_pre_attn_scalar=32, sliding_window=WINDOW, layer_types=ALTERNATING)
    built = {
        "qwen2": lambda: (t.Qwen2ForCausalLM, t.Qwen2Config(**SHAPE, **ids)),
        "qwen3": lambda: (t.Qwen3ForCausalLM, t.Qwen3Config(**SHAPE, **ids)),
        "llama3.2": lambda: (
            t.LlamaForCausalLM,
            t.LlamaConfig(**SHAPE, **ids, tie_word_embeddings=True, rope_parameters={**llama3, "original_max_position_embeddings": 128}),
        ),
        "mistral": lambda: (t.MistralForCausalLM, t.MistralConfig(**SHAPE, **ids, sliding_window=WINDOW)),
        "gemma2": lambda: (
            t.Gemma2ForCausalLM,
            t.Gemma2Config(**SHAPE, **ids, **gemma, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
        ),
        "gemma3": lambda: (t.Gemma3ForCausalLM, t.Gemma3TextConfig(**SHAPE, **ids, **gemma)),
        "phi3": lambda: (t.Phi3ForCausalLM, t.Phi3Config(**{k: v for k, v in SHAPE.items() if k != "head_dim"}, **ids)),
    }
    if name not in built:
        raise ValueError(f"unknown family {name!r}; one of {', '.join(FAMILIES)}")
    return built[name]()


def build_family(name: str, directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny random model of family `name` (one of FAMILIES) and the tiny tokenizer into `directory`."""
    import torch
    from tiny import build_tokenizer

    directory = Path(directory)
    tok = build_tokenizer()
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model_cls, config = _config(name, ids)
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
