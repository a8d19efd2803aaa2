"""The settings an evaluation result depends on: presets, their resolution, and the resume check.

Every choice that changes a number is explicit and recorded: a preset names a standard protocol and each of
its settings can be overridden flag by flag; settings.json and summary.json store the resolved settings and
package versions, and a rerun into the same output with other settings, or with other data under the same
dataset name (the sha256 of the file read differs), is refused rather than mixed in.

Presets:
  greedy     T=0, n=1, 3,000 new tokens, Qwen-Math system prompt asking for a \\boxed{} answer (Dr.GRPO/oat)
  reasoning  T=0.6, top_p=0.95, n=16, 32,768 new tokens (clipped to the context window), the DeepSeek-R1
             instruction in the user turn and no system prompt (open-r1 / lighteval; use --n 32 for avg@32)
  train      the run's own prompt template and completion budget, greedy (its training task's held-out split)
  auto       (default) train on the run's own dataset, greedy on any other
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from thinkrl.config import Config
from thinkrl.config.sections import EVAL_N_WHY, MAX_EVAL_N, MAX_EVAL_SAMPLES
from thinkrl.errors import UserError, short
from thinkrl.run.console import console

STEP_BY_STEP = "Please reason step by step, and put your final answer within \\boxed{}."
PRESETS = {
    "greedy": dict(n=1, temperature=0.0, top_p=1.0, max_new_tokens=3000, template="auto", system=STEP_BY_STEP, instruction="{problem}"),
    "reasoning": dict(
        n=16, temperature=0.6, top_p=0.95, max_new_tokens=32768, template="auto", system=None, instruction="{problem}\n" + STEP_BY_STEP
    ),
}
MAX_SEED = 2**32 - 1
# settings that change the numbers: a resumed evaluation must match on all of them
_SAME_ON_RESUME = (
    "model",
    "checkpoint",
    "checkpoint_step",
    "adapter",
    "dataset",
    "split",
    "n",
    "temperature",
    "top_p",
    "max_new_tokens",
    "seed",
    "template",
    "system",
    "instruction",
    "grader",
)


@dataclass
class EvalSettings:
    model: str
    dataset: str
    preset: str = "auto"
    split: str | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    template: str | None = None
    system: str | None = None
    instruction: str | None = None
    seed: int = 0
    limit: int = 0
    batch_size: int = 64  # completions decoded together
    adapter: str | None = None
    grader: str = "thinkrl.verifier:grade"
    engine: str = "auto"  # auto | lean | transformers | vllm (thinkrl/rollout/engines/)
    checkpoint: str | None = None  # the checkpoint evaluated, when the model is a run directory
    checkpoint_step: int | None = None  # its training step


def resolve_settings(s: EvalSettings, cfg: Config) -> EvalSettings:
    """Fill every None from the preset; 'auto' picks 'train' on the config's own dataset, else 'greedy'."""
    preset = s.preset
    if preset == "auto":
        preset = "train" if s.dataset in ("", cfg.data.name) else "greedy"
    if preset == "train":
        base = dict(n=1, temperature=0.0, top_p=1.0, max_new_tokens=cfg.rollout.max_new_tokens, **asdict(cfg.prompt))
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise UserError(f"unknown --preset {s.preset!r}; choose auto, train, {', '.join(PRESETS)}")
    filled = {k: (getattr(s, k) if getattr(s, k) is not None else v) for k, v in base.items()}
    if s.system == "none":  # `--system none` removes the preset's system prompt
        filled["system"] = None
    out = replace(s, preset=preset, dataset=s.dataset or cfg.data.name, **filled)
    if not (math.isfinite(out.temperature) and out.temperature >= 0):
        raise UserError(f"--temperature must be a finite number >= 0 (0 = greedy), got {out.temperature}")
    if out.n > MAX_EVAL_N:
        raise UserError(f"--n {out.n}: at most {MAX_EVAL_N} samples per problem ({EVAL_N_WHY})")
    if not 0 <= out.seed <= MAX_SEED:  # each batch's generator is seeded with seed * 1,000,003 + batch: it must fit 64 bits
        raise UserError(f"--seed must be in [0, {MAX_SEED}] (a 32-bit seed), got {short(out.seed)}")
    for bad, flag, rule in (
        (out.n < 1, "--n", ">= 1 (samples per problem)"),
        (out.max_new_tokens < 1, "--max-new-tokens", ">= 1 (the completion budget in tokens)"),
        (not 0 < out.top_p <= 1, "--top-p", "in (0, 1] (1 = off)"),
    ):
        if bad:  # each flag named with its bound and the value given (or the preset's)
            raise UserError(f"{flag} must be {rule}, got {short(getattr(out, flag[2:].replace('-', '_')))}")
    if out.n > 1 and out.temperature == 0:
        if s.temperature is None:  # n samples of a greedy preset would be n copies: sample as `reasoning` does
            out = replace(out, temperature=PRESETS["reasoning"]["temperature"], top_p=s.top_p or PRESETS["reasoning"]["top_p"])
            console.print(
                f"note: --n {out.n} with the {preset} preset: sampling at temperature {out.temperature}, top_p {out.top_p} "
                "(set --temperature to choose)"
            )
        else:
            console.print("[yellow]warning: n > 1 with temperature 0 gives n identical greedy samples[/]")
    return out


def check_sample_count(s: EvalSettings, problems: int) -> None:
    """Before the model loads: n x problems completions must fit samples.jsonl and the summary that reads it back."""
    if s.n * problems > MAX_EVAL_SAMPLES:
        raise UserError(
            f"{s.dataset}: --n {s.n} x {problems} problems = {s.n * problems:,} completions, more than {MAX_EVAL_SAMPLES:,} "
            "(samples.jsonl holds a line per completion and the summary reads them all back); lower --n or --limit"
        )


def versions() -> dict[str, str]:
    out = {}
    for pkg in ("thinkrl", "torch", "transformers", "peft", "math-verify", "sympy"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def check_resume(out_dir: Path, settings: dict) -> None:
    path = out_dir / "settings.json"
    if not path.is_file() or not (out_dir / "samples.jsonl").is_file():
        return
    old = json.loads(path.read_text())
    diff = [k for k in _SAME_ON_RESUME if old.get(k) != settings.get(k)]
    if diff:
        k = diff[0]
        raise UserError(
            f"{out_dir} holds samples made with {k}={old.get(k)!r} (now {settings.get(k)!r}); use a new --output to evaluate other settings"
        )
    if "dataset_sha256" in old and old["dataset_sha256"] != settings.get("dataset_sha256"):  # older outputs recorded no hash
        was, now = (f"{d.get('dataset_source')} (sha256 {str(d.get('dataset_sha256'))[:12]})" for d in (old, settings))
        raise UserError(
            f"{out_dir} holds samples of {was}, but {settings.get('dataset')} now reads {now}: other data; "
            "use a new --output (or restore that file)"
        )
    if old.get("limit") != settings.get("limit"):
        console.print(f"note: --limit changed from {old.get('limit')} to {settings.get('limit')}; finished samples are kept")
