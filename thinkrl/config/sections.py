"""Run configuration: every setting, its default and a one-line doc, as nested dataclasses.

How a config is loaded (YAML, `-o key=value` overrides, the checks that span sections) is thinkrl/config/load.py.
The defaults are the calibrated first run: the bundled SmolLM2-135M-Instruct with LoRA on the built-in
arithmetic task, sized for 2 CPU cores (see `make demo`); configs/ holds recipes for other settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Each section checks its own fields in __post_init__ (a ValueError whose message starts with the field
# name); config/load.py runs those checks again on the final values and prefixes the section's path, and
# its resolve() holds only the rules that span sections.


def check(*rules: tuple[bool, str]) -> None:
    """Raise ValueError with the message of the first rule that does not hold."""
    for ok, message in rules:
        if not ok:
            raise ValueError(message)


@dataclass
class LoraConfig:
    rank: int = 16
    """LoRA rank; 0 = full fine-tuning of every weight."""
    alpha: float = 32.0
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names to adapt; 'all-linear' = every linear layer except the output head."""

    def __post_init__(self) -> None:
        check(
            (self.rank >= 0, f"rank must be >= 0 (0 = full fine-tuning), got {self.rank}"),
            (self.alpha > 0, f"alpha must be > 0 (the update is scaled by alpha / rank), got {self.alpha}"),
            (0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}"),
        )


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """Hub id, local directory, or the alias smollm2-135m (bundled SmolLM2-135M-Instruct)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Trainer dtype; auto = float32 on CPU, bfloat16 on CUDA."""
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
            (bool(self.ops) and not set(self.ops) - set("+-*"), f"ops must be drawn from '+-*', got {self.ops!r}"),
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


@dataclass
class RolloutConfig:
    group_size: int = 8
    """Completions sampled per prompt (G)."""
    prompts_per_step: int = 2
    """Prompts per training step; the step's batch is prompts_per_step x group_size completions."""
    max_new_tokens: int = 48
    """Longest completion; longer ones are cut and counted as truncated."""
    min_new_tokens: int = 0
    """Suppress EOS before this many tokens (benchmarks: fixed-length completions, as TRL's min_new_tokens)."""
    temperature: float = 1.0
    """Sampling temperature; the policy being trained is softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    precision: Literal["same", "bf16", "fp16", "fp8"] = "same"
    """Weights of the sampling copy of the policy: same = the trainer's; bf16 / fp16 = cast; fp8 = float8
    (e4m3) fake-quantised linear weights with per-output-channel scales. The trainer keeps its dtype, so
    anything but 'same' creates a measurable rollout/trainer mismatch (logged as mismatch/*)."""
    staleness: int = 0
    """Sample with the policy of this many training steps ago (0 = the current one): controlled off-policy data."""
    batch_size: int = 64
    """Completions decoded together in one generation batch (whole groups; Thinking Seeds rounds decode at once)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts until the step is full."""
    max_sampling_rounds: int = 3
    """Generation rounds per step at most with dynamic_sampling (the first included); then train on what there is."""
    mask_truncated: bool = False
    """Exclude completions that hit max_new_tokens from the loss (DAPO's overlong filtering)."""

    def __post_init__(self) -> None:
        check(
            (self.group_size >= 1, f"group_size must be >= 1, got {self.group_size}"),
            (self.prompts_per_step >= 1, f"prompts_per_step must be >= 1, got {self.prompts_per_step}"),
            (self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}"),
            (0 <= self.min_new_tokens <= self.max_new_tokens, f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}"),
            (self.temperature > 0, f"temperature must be > 0 for training (sampling), got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}"),
            (self.staleness >= 0, f"staleness must be >= 0 (0 = sample with the current policy), got {self.staleness}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.max_sampling_rounds >= 1, f"max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}"),
        )


@dataclass
class RewardConfig:
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: over the last N tokens of the budget the reward falls linearly by
    up to overlong_penalty (0 = off)."""
    overlong_penalty: float = 1.0
    """Largest overlong punishment, reached at rollout.max_new_tokens."""

    def __post_init__(self) -> None:
        check(
            (self.overlong_buffer >= 0, f"overlong_buffer must be >= 0 (0 = off), got {self.overlong_buffer}"),
            (self.overlong_penalty >= 0, f"overlong_penalty must be >= 0, got {self.overlong_penalty}"),
        )


@dataclass
class CorrectionConfig:
    mode: Literal["none", "tis", "mis"] = "none"
    """Rollout-mismatch correction with rho = pi_old / mu: tis truncates the weight at c_max, mis masks
    tokens (or sequences) whose rho falls outside [c_min, c_max]; works with every method."""
    level: Literal["token", "sequence"] = "token"
    """token: rho per token; sequence: the product of a sequence's token ratios, one weight per sequence."""
    c_max: float = 2.0
    """Upper threshold (TIS cap, MIS upper bound)."""
    c_min: float = 0.0
    """Lower threshold (MIS only)."""

    def __post_init__(self) -> None:
        check((self.c_max > 0 and 0 <= self.c_min < self.c_max, f"c_min and c_max need 0 <= c_min < c_max, got {self.c_min} and {self.c_max}"))


@dataclass
class AdvantageConfig:
    estimator: Literal["auto", "grpo", "no_std", "rloo"] = "auto"
    """auto = the method's own choice; grpo = (r-mean)/(std+eps); no_std = r-mean (Dr.GRPO); rloo = leave-one-out."""
    eps: float = 1e-6
    """Added to the group std (grpo estimator)."""

    def __post_init__(self) -> None:
        check((self.eps >= 0, f"eps must be >= 0, got {self.eps}"))


@dataclass
class VerifierConfig:
    timeout: float = 5.0
    """Seconds a single completion may take to grade; past it the sample scores 0."""
    workers: int = 2
    """Grading worker processes."""
    grader: str = "thinkrl.verifier:grade"
    """module:function (completion, answer) -> (score, extracted answer or None), run in the workers."""

    def __post_init__(self) -> None:
        check(
            (self.timeout > 0, f"timeout must be > 0 seconds, got {self.timeout}"),
            (self.workers >= 1, f"workers must be >= 1, got {self.workers}"),
        )


@dataclass
class TrainConfig:
    steps: int = 40
    """Training steps; each is one rollout followed by its updates."""
    lr: float = 2e-4
    """Peak learning rate (LoRA needs ~10x the full fine-tuning rate)."""
    seed: int = 0
    """Seed for sampling, data order and initialisation; every step reseeds from (seed, step)."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate decay after warm-up."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    micro_batch_tokens: int = 4096
    """Cap on padded completion tokens per forward/backward pass (0 = none): long completions get fewer
    rows per micro-batch (memory only: the result does not depend on it)."""
    gradient_checkpointing: bool = False
    """Recompute each layer in the backward instead of keeping its activations: far less memory for long
    completions, more update time (every layer runs forward twice and each completion recomputes its prompt)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass (memory knob; does not change the result)."""
    mini_batches: int = 1
    """Optimizer steps per pass over one rollout batch."""
    epochs: int = 1
    """Passes over each rollout batch; updates per rollout = mini_batches x epochs."""
    old_policy: Literal["recompute", "sampler"] = "recompute"
    """Where pi_old comes from: recompute = the trainer's policy at the start of the update phase;
    sampler = the sampler's own log-probs (verl's bypass mode: ratios then include staleness and precision)."""
    save_every: int = 0
    """Checkpoint every N steps (0 = only at the end)."""
    keep_last: int = 2
    """Checkpoints kept on disk (0 = keep all)."""
    max_nonfinite_steps: int = 3
    """Stop (after a checkpoint) when this many consecutive steps had every update skipped for a NaN/inf
    loss or gradient (0 = never stop; skipped updates are always counted as update/skipped_nonfinite)."""

    def __post_init__(self) -> None:
        check(
            (self.steps >= 1, f"steps must be >= 1, got {self.steps}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}"),
            (self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}"),
            (len(self.adam_betas) == 2, f"adam_betas needs two values, got {self.adam_betas}"),
            (all(0 <= b < 1 for b in self.adam_betas), f"adam_betas must each be in [0, 1), got {self.adam_betas}"),
            (self.grad_clip >= 0, f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}"),
            (self.micro_batch_tokens >= 0, f"micro_batch_tokens must be >= 0 (0 = no cap), got {self.micro_batch_tokens}"),
            (self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}"),
            (self.mini_batches >= 1, f"mini_batches must be >= 1, got {self.mini_batches}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.save_every >= 0, f"save_every must be >= 0 (0 = only at the end), got {self.save_every}"),
            (self.keep_last >= 0, f"keep_last must be >= 0 (0 = keep all), got {self.keep_last}"),
            (self.max_nonfinite_steps >= 0, f"max_nonfinite_steps must be >= 0 (0 = never stop), got {self.max_nonfinite_steps}"),
        )


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
            (self.n is None or self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.max_new_tokens is None or self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}"),
            (self.preset in ("auto", "train", "greedy", "reasoning"), f"preset={self.preset!r}: choose auto, train, greedy or reasoning"),
        )


@dataclass
class SeedsConfig:
    enabled: bool | None = None
    """Thinking Seeds: start some completions of each group from a prefix sampled by an earlier checkpoint;
    None = on when the method requires prefix_mask (thinking_seeds), off otherwise."""
    every: int = 20
    """Add the current policy to the pool of historical checkpoints every N steps (step 0 included)."""
    pool_size: int = 4
    """Historical checkpoints kept (first in, first out); a pinned initial policy comes on top."""
    keep_initial: bool = True
    """Pin the initial policy (the highest-entropy one) in the pool for the whole run."""
    per_group: int = 2
    """Seeded completions per group of rollout.group_size (the rest are ordinary samples)."""
    prefix: Literal["fraction", "tokens"] = "fraction"
    """fraction: the historical policy writes a whole completion and a fraction U(frac_min, frac_max) of it is
    kept; tokens: it writes U{tokens_min..tokens_max} tokens (cheaper)."""
    frac_min: float = 0.1
    """Smallest kept fraction of the historical completion."""
    frac_max: float = 0.5
    """Largest kept fraction of the historical completion."""
    tokens_min: int = 4
    """Shortest prefix in tokens (prefix: tokens)."""
    tokens_max: int = 16
    """Longest prefix in tokens (prefix: tokens)."""
    snap: Literal["none", "line", "sentence"] = "none"
    """Cut the prefix back to the end of its last line (or sentence) when it has one: whole reasoning steps."""
    storage: Literal["auto", "memory", "disk"] = "auto"
    """Where pool weights live: auto = memory for LoRA adapters (a few MB), disk (RUN_DIR/seeds/) for full weights."""

    def __post_init__(self) -> None:
        check(
            (self.every >= 1, f"every must be >= 1, got {self.every}"),
            (self.pool_size >= 1, f"pool_size must be >= 1, got {self.pool_size}"),
            (self.per_group >= 1, f"per_group must be >= 1, got {self.per_group}"),
            (0 < self.frac_min <= self.frac_max <= 1, f"frac_min and frac_max need 0 < frac_min <= frac_max <= 1, got {self.frac_min} and {self.frac_max}"),
            (1 <= self.tokens_min <= self.tokens_max, f"tokens_min and tokens_max need 1 <= tokens_min <= tokens_max, got {self.tokens_min} and {self.tokens_max}"),
        )


@dataclass
class LogConfig:
    rollouts_every: int = 1
    """Write the step's prompts, completions and rewards to rollouts.jsonl every N steps (0 = never)."""
    trackers: list[str] = field(default_factory=list)
    """Also log to these Accelerate trackers: tensorboard, wandb, mlflow, ... (metrics.jsonl is always written)."""
    project: str = "thinkrl"
    """Tracker project name (W&B/MLflow project; TensorBoard: RUN_DIR/trackers/<project>/)."""


@dataclass
class MethodSection:
    name: str = "grpo"
    """Policy-loss method (see `thinkrl methods`)."""
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
    """Run directory; default runs/<timestamp>-<method>."""
