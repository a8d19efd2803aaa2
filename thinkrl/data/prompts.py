"""Problems -> prompts: the chat or plain template, tokenized; and which prompts a training step takes."""

from __future__ import annotations

import random
from dataclasses import dataclass

from thinkrl.config import PromptConfig
from thinkrl.data.problems import Problem
from thinkrl.errors import UserError


@dataclass
class Prompt:
    id: str
    problem: str
    answer: str
    text: str  # the rendered prompt (template applied)
    ids: list[int]  # its tokens


def render_prompt(problem: str, tokenizer, cfg: PromptConfig) -> tuple[str, bool]:
    """The prompt text and whether it came from the chat template (which already holds special tokens)."""
    user = cfg.instruction.replace("{problem}", problem)
    chat = cfg.template == "chat" or (cfg.template == "auto" and getattr(tokenizer, "chat_template", None))
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("prompt.template=chat but this tokenizer has no chat template; use prompt.template=plain")
        messages = ([{"role": "system", "content": cfg.system}] if cfg.system else []) + [{"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True
    system = f"{cfg.system}\n\n" if cfg.system else ""
    return f"{system}Question: {user}\nAnswer:", False


def build_prompts(problems: list[Problem], tokenizer, cfg: PromptConfig, max_tokens: int) -> tuple[list[Prompt], int]:
    """Render and tokenize; prompts longer than max_tokens are dropped and counted."""
    out, too_long = [], 0
    for p in problems:
        text, chat = render_prompt(p.problem, tokenizer, cfg)
        ids = tokenizer(text, add_special_tokens=not chat)["input_ids"]
        if len(ids) > max_tokens:
            too_long += 1
            continue
        out.append(Prompt(p.id, p.problem, p.answer, text, ids))
    return out, too_long


def step_prompts(prompts: list[Prompt], step: int, per_step: int, seed: int) -> list[Prompt]:
    """The prompts of one training step: a fresh seeded permutation each epoch, so any step is
    reproducible from (seed, step) alone and resuming needs no saved data position."""
    out, n = [], len(prompts)
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n)
        order = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(prompts[order[pos]])
    return out
