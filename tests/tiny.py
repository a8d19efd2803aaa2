"""A tiny random-initialised causal LM with a character-level tokenizer, built offline in a directory.

Used by the fast tests (and usable by anyone) as `--model DIR`: no network, a few hundred KB, loads in
well under a second. Its completions are noise, which is all plumbing tests need.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(chat: bool = True):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("<\\|[a-z]+\\|>|<[a-z]+>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[4:]})
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(directory: str | Path, seed: int = 0, chat: bool = True, heads: int = 4, head_dim: int = 8) -> Path:
    """Write a tiny Llama-shaped model + tokenizer into `directory` and return it (heads query heads of
    head_dim, half as many key/value heads; vLLM's CPU kernels need head_dim >= 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    tok = build_tokenizer(chat)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=head_dim,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def tiny_lora_model(directory: str | Path):
    """The tiny model from `directory` with LoRA (rank 4) on every linear layer and B drawn non-zero (peft starts
    it at zero, which would hide any mistake in the low-rank path); the same weights every call."""
    import torch
    from transformers import AutoModelForCausalLM

    from thinkrl.config import LoraConfig
    from thinkrl.models import add_lora

    torch.manual_seed(0)
    model = add_lora(AutoModelForCausalLM.from_pretrained(directory), LoraConfig(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return model
