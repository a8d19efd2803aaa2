"""Problems -> prompts: the chat or plain template, tokenized; which prompts fit the model's context (the
one rule training and eval share); and which prompts a training step takes."""

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


def uses_chat(tokenizer, cfg: PromptConfig) -> bool:
    """Whether prompts are rendered with the tokenizer's chat template (prompt.template auto: when it has one)."""
    return cfg.template == "chat" or (cfg.template == "auto" and bool(getattr(tokenizer, "chat_template", None)))


def template_note(tokenizer, cfg: PromptConfig) -> str | None:
    """The one line to print when prompt.template=auto falls back to the plain template, which a model tuned
    on its chat format may answer worse: the user should know, and how to choose."""
    if cfg.template != "auto" or uses_chat(tokenizer, cfg):
        return None
    return (
        "note: the tokenizer has no chat template, so prompts use the plain 'Question: ... Answer:' template "
        "(choose one with prompt.template=plain or prompt.template=chat)"
    )


def render_prompt(problem: str, tokenizer, cfg: PromptConfig) -> tuple[str, bool]:
    """The prompt text and whether it came from the chat template (which already holds special tokens)."""
    user = cfg.instruction.replace("{problem}", problem)
    if uses_chat(tokenizer, cfg):
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


SANE_CONTEXT = 10**7  # a tokenizer's model_max_length above this is transformers' "not set" (int(1e30))


def model_context(model_config, tokenizer=None) -> int | None:
    """The model's context window in tokens: its config's max_position_embeddings, else the tokenizer's
    model_max_length when it is a real value; None when neither says."""
    for n in (getattr(model_config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)):
        if isinstance(n, int) and 0 < n < SANE_CONTEXT:
            return n
    return None


def fit_context(prompts: list[Prompt], context: int | None, room: int) -> tuple[list[Prompt], int]:
    """The prompts that leave `room` new tokens within a `context`-token window, and how many do not. Eval
    asks for room 1 (it clips each prompt's budget to what is left); training for its whole budget."""
    if context is None:
        return prompts, 0
    kept = [p for p in prompts if len(p.ids) + room <= context]
    return kept, len(prompts) - len(kept)


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
