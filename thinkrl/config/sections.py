"""Run configuration: every setting, its default and a one-line doc, as nested dataclasses.

This file holds the root `Config` and the model, prompt, data, eval, log and method sections; the rollout and
learner sections are in config/rollout.py and config/learner.py. Each section checks its own fields in
__post_init__ (a ValueError whose message starts with the field name); config/load.py runs those checks again
on the loaded values, prefixing the section's path, and its resolve() holds only the rules that span sections.
The defaults are the calibrated first run: the bundled SmolLM2-135M-Instruct with LoRA on the built-in
arithmetic task, sized for 2 CPU cores (see `make demo`); configs/ holds recipes for other settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from thinkrl.config.learner import AdvantageConfig, CorrectionConfig, TrainConfig
from thinkrl.config.rollout import RewardConfig, RolloutConfig, SeedsConfig, VerifierConfig
from thinkrl.config.typecheck import check
from thinkrl.errors import short


@dataclass
class LoraConfig:
    rank: int = 16
    """LoRA rank; 0 = full fine-tuning of every weight."""
    alpha: float = 32.0
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch. RL updates run with dropout off (pi_old, the reference and the training forward must
    see one deterministic policy, so a ratio starts at exactly 1); it acts only if the adapter is trained elsewhere."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt; 'all-linear' = every linear layer except the output head."""

    def __post_init__(self) -> None:
        check(
            (self.rank >= 0, f"rank must be >= 0 (0 = full fine-tuning), got {self.rank}"),
            (0 < self.alpha < math.inf, f"alpha must be > 0 and finite (the update is scaled by alpha / rank), got {self.alpha}"),
            (0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}"),
        )


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """Hub id, local directory, or the alias smollm2-135m (bundled SmolLM2-135M-Instruct)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype: the forwards' matmuls and LoRA's frozen base; auto = float32 on CPU, bfloat16 on CUDA."""
    master_dtype: Literal["float32", "same"] = "float32"
    """Dtype of the trained weights and so of AdamW's moments: float32 masters (a bfloat16 weight cannot take an
    update of lr 1e-6, docs/distributed.md), or same = model.dtype (pure bfloat16: less memory, most updates lost)."""
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class PromptConfig:
    template: Literal["auto", "chat", "plain"] = "auto"
    """auto = the tokenizer's chat template when it has one, else the plain template."""
    system: str | None = None
    """System message for chat templates; None keeps the template's own default."""
    instruction: str = "{problem}\nPut the final answer in \\boxed{}."
    """User message; {problem} is replaced by the problem text."""


@dataclass
class ArithConfig:
    min_value: int = 10
    """Smallest operand."""
    max_value: int = 99
    """Largest operand."""
    ops: str = "+"
    """Operators to draw from, e.g. '+-*'."""
    terms: int = 2
    """Operands per problem."""
    train_size: int = 4000
    """Problems in the train split."""
    test_size: int = 500
    """Problems in the held-out test split (disjoint from train)."""
    seed: int = 1234
    """Seed of the problem generator (independent of train.seed)."""

    def __post_init__(self) -> None:
        check(
            (bool(self.ops) and not set(self.ops) - set("+-*"), f"ops must be drawn from '+-*', got {short(self.ops)}"),
            (self.terms >= 2, f"terms must be >= 2, got {self.terms}"),
            (self.min_value <= self.max_value, f"min_value must be <= max_value, got {self.min_value} > {self.max_value}"),
            (self.train_size >= 0 and self.test_size >= 0, "train_size and test_size must be >= 0"),
        )
        needed = self.train_size + self.test_size
        distinct = (self.max_value - self.min_value + 1) ** self.terms * len(self.ops) ** (self.terms - 1)
        # the 1.25 margin keeps the generator's rejection loop short
        check((distinct >= needed * 1.25, f"min_value..max_value is too small a range for {needed} distinct problems; widen it"))


@dataclass
class DataConfig:
    name: str = "arith"
    """'arith' (built-in task), a dataset alias, a Hugging Face dataset id, or a .jsonl/.json/.parquet/.csv file."""
    split: str = "train"
    """Split to train on."""
    subset: str | None = None
    """Hugging Face dataset config name, if the dataset has several."""
    problem_key: str = "problem"
    """Column holding the problem text."""
    answer_key: str = "answer"
    """Column holding the reference answer."""
    max_prompt_tokens: int = 512
    """Rows whose prompt is longer are skipped (and counted)."""
    limit: int = 0
    """Use only the first N rows (0 = all)."""
    arith: ArithConfig = field(default_factory=ArithConfig)

    def __post_init__(self) -> None:
        check(
            (self.max_prompt_tokens >= 1, f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}"),
            (self.limit >= 0, f"limit must be >= 0 (0 = all rows), got {self.limit}"),
        )


MAX_EVAL_N = 100_000  # samples per problem (eval.n, thinkrl eval --n)
EVAL_N_WHY = "one problem's n completions are decoded and graded together, and past 100,000 avg@n's interval is under 0.003"
MAX_EVAL_SAMPLES = 10_000_000  # n x problems: samples.jsonl holds a line per completion and the summary reads them all back


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate every N steps and after the last one (0 = never); results go to RUN_DIR/eval/step-N/."""
    datasets: list[str] = field(default_factory=list)
    """Datasets to evaluate (see `thinkrl eval --dataset`); empty = the training task's held-out split."""
    n: int | None = None
    """Samples per problem (None = the preset's)."""
    limit: int = 0
    """Problems per dataset (0 = all)."""
    preset: str = "auto"
    """auto | train | greedy | reasoning, as for `thinkrl eval --preset`."""
    max_new_tokens: int | None = None
    """Completion budget (None = the preset's)."""

    def __post_init__(self) -> None:
        check(
            (self.every >= 0, f"every must be >= 0 (0 = never), got {self.every}"),
            (self.limit >= 0, f"limit must be >= 0 (0 = all), got {self.limit}"),
            (self.n is None or 1 <= self.n <= MAX_EVAL_N, f"n must be in [1, {MAX_EVAL_N}] ({EVAL_N_WHY}), got {self.n}"),
            (self.max_new_tokens is None or self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}"),
            (
                self.preset in ("auto", "train", "greedy", "reasoning"),
                f"preset={short(self.preset)}: choose auto, train, greedy or reasoning",
            ),
        )


@dataclass
class LogConfig:
    rollouts_every: int = 1
    """Write the step's prompts, completions and rewards to rollouts.jsonl every N steps (0 = never)."""
    trackers: list[str] = field(default_factory=list)
    """Also log to these Accelerate trackers: tensorboard, wandb, mlflow, ... (metrics.jsonl is always written)."""
    project: str = "thinkrl"
    """Tracker project name (W&B/MLflow project; TensorBoard: RUN_DIR/trackers/<project>/)."""

    def __post_init__(self) -> None:
        check((self.rollouts_every >= 0, f"rollouts_every must be >= 0 (0 = never), got {self.rollouts_every}"))


@dataclass
class MethodSection:
    name: str = "grpo"
    """Policy-loss method (see `thinkrl methods`)."""
    recipe: bool | str = True
    """Whose recipe (the regime a paper studies: thinkrl methods NAME) goes beneath the file and -o: true = this
    method's, a method name = that method's regime (its loss's own parameters excepted), none = no recipe."""
    params: dict[str, Any] = field(default_factory=dict)
    """The method's own hyperparameters (validated against its Config)."""


@dataclass
class Config:
    method: MethodSection = field(default_factory=MethodSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seeds: SeedsConfig = field(default_factory=SeedsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str | None = None
    """Run directory; default runs/<timestamp>-<random>-<method>."""
