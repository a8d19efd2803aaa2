"""A randomly initialised model of Qwen2.5-1.5B's shape, for GPU speed runs that need no downloaded weights.

    python bench/bench_trl.py --model random-qwen2.5-1.5b --max-new-tokens 512
    python bench/bench_trl.py --model random-qwen2.5-1.5b --max-new-tokens 4096 --prompts 1

Same layer count, widths, heads, vocabulary and tied embeddings as Qwen/Qwen2.5-1.5B (1.54B parameters),
so every matmul, the KV cache and the (B, T, V) logits cost what they cost with real weights. Speed does not
depend on the weight values; rewards do (they stay about 0), so only time and memory mean anything here.
The tokenizer is the bundled SmolLM2 one (49,152 ids): prompts use it, and sampled ids above its range
decode to nothing, for both trainers alike.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

NAME = "random-qwen2.5-1.5b"
SHAPE = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def model_dir(name: str) -> str:
    """A local directory for `name`: the random model (built once, under the temp dir), or `name` itself."""
    if name != NAME:
        return name
    out = Path(tempfile.gettempdir()) / "thinkrl-bench" / NAME
    if (out / "config.json").is_file():
        return str(out)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from thinkrl.models import load_tokenizer, resolve_path

    # THINKRL_TOKENIZER_DIR: the SmolLM2 tokenizer files alone (bench/gpu.sh carries them; the GGUF does not fit)
    tok = load_tokenizer(os.environ.get("THINKRL_TOKENIZER_DIR") or resolve_path("smollm2-135m"))
    config = Qwen2Config(**SHAPE, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
