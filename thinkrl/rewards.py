"""The built-in reward functions for reward.functions: format_boxed, format_think, length_penalty.

Each is fn(completion, answer, **options) -> a number, named in a config as "thinkrl.rewards:NAME"; how named,
weighted rewards are loaded, run in the verifier's workers and summed is thinkrl/verifier/rewards.py.
"""

from __future__ import annotations

from thinkrl.verifier import MAX_ANSWER_CHARS, extract_boxed


def format_boxed(completion: str, answer: str) -> float:
    """1.0 when the completion states a final answer in \\boxed{...}: non-empty and no longer than the verifier
    reads (MAX_ANSWER_CHARS); else 0.0. Whether that answer is right is the verifier's business."""
    box = extract_boxed(completion)
    return 1.0 if box is not None and 0 < len(box.strip()) <= MAX_ANSWER_CHARS else 0.0


def format_think(completion: str, answer: str) -> float:
    """1.0 for `<think> reasoning </think> answer`, both parts non-empty and no other think tag; else 0.0.

    The opening <think> may be missing: chat templates such as DeepSeek-R1's and Qwen3's end the prompt with it,
    so the completion starts inside the reasoning. (The tags must survive decoding: they do for tokenizers that
    do not mark them as special tokens, which covers those models.)"""
    text = completion.strip()
    if text.startswith("<think>"):
        text = text[len("<think>") :]
    reasoning, close, rest = text.partition("</think>")
    tags = ("<think>", "</think>")
    ok = close and reasoning.strip() and rest.strip() and not any(t in reasoning or t in rest for t in tags)
    return 1.0 if ok else 0.0


def length_penalty(completion: str, answer: str, max_chars: int = 4000) -> float:
    """-len(completion) / max_chars, floored at -1.0: 0.0 for an empty completion, -1.0 from max_chars characters on.

    Characters, not tokens: the workers see text only. At about 4 characters per token (English, maths), set
    options: {max_chars: 4 x rollout.max_new_tokens} to spread the penalty over the whole budget."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    return -min(len(completion), max_chars) / max_chars
