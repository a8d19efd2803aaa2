"""Data: problems {id, problem, answer} from their sources (data/sources.py, the built-in task in
data/arith.py), and the prompts built from them (data/prompts.py)."""

from thinkrl.data.problems import Loaded, Problem, normalise_answer
from thinkrl.data.prompts import Prompt, build_prompts, render_prompt, step_prompts
from thinkrl.data.sources import ALIASES, load_problems

__all__ = ["ALIASES", "Loaded", "Problem", "Prompt", "build_prompts", "load_problems", "normalise_answer", "render_prompt", "step_prompts"]
