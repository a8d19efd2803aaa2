"""Data: problems {id, problem, answer} from their sources (data/sources.py, the built-in task in
data/arith.py), and the prompts built from them (data/prompts.py)."""

from thinkrl.data.problems import Loaded, Problem, normalise_answer
from thinkrl.data.prompts import Prompt, build_prompts, fit_context, model_context, render_prompt, step_prompts, template_note, uses_chat
from thinkrl.data.sources import ALIASES, load_problems

__all__ = [
    "ALIASES",
    "Loaded",
    "Problem",
    "Prompt",
    "build_prompts",
    "fit_context",
    "load_problems",
    "model_context",
    "normalise_answer",
    "render_prompt",
    "step_prompts",
    "template_note",
    "uses_chat",
]
