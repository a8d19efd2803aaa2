"""Generation engines: prompts in, `Completions` (tokens, behaviour log-probs, mask, lengths) out.

lean.py           the KV-cache decode loop (and lean_decoder.py, its fused Llama/Qwen2 step)
"""
