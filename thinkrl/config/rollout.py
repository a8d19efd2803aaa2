"""Config sections of the rollout stage: sampling, reward shaping, the verifier, Thinking Seeds."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

import yaml

from thinkrl.config.typecheck import check
from thinkrl.errors import short


@dataclass
class VLLMConfig:
    memory: float = 0.0
    """Share of GPU memory (on a CPU: of RAM) vLLM reserves for weights and KV cache; 0 = 0.3 on CUDA, 0.15 on a CPU."""
    max_model_len: int = 0
    """Longest prompt + completion vLLM plans for; 0 = data.max_prompt_tokens + rollout.max_new_tokens."""
    sleep: bool = True
    """On CUDA, release vLLM's KV cache during each update (sleep mode) and take it back before the next rollout."""

    def __post_init__(self) -> None:
        check(
            (0 <= self.memory < 1, f"memory must be in [0, 1) (0 = the default share), got {self.memory}"),
            (self.max_model_len >= 0, f"max_model_len must be >= 0 (0 = prompt + budget), got {self.max_model_len}"),
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
    precision: Literal["same", "bf16", "fp16", "fp8", "fp4"] = "same"
    """Weights of the sampling copy of the policy: same = the trainer's; bf16 / fp16 = cast; fp8 = float8
    (e4m3) fake-quantised linear weights with per-output-channel scales; fp4 = float4 (e2m1) with one scale per
    16 weights (as NVFP4), a gap large enough to bias an uncorrected update (lean and transformers engines only).
    The trainer keeps its dtype, so anything but 'same' creates a measurable rollout/trainer mismatch (logged as mismatch/*)."""
    staleness: int = 0
    """Sample with the policy of this many training steps ago (0 = the current one): controlled off-policy data."""
    agreement_every: int = 10
    """Check on step 1 and every N steps after that the engine's behaviour log-probs equal the trainer's where they must
    agree to rounding (no staleness, top_p, top_k, min_new_tokens or fp8); a gap past the dtype's threshold warns
    once and is logged as mismatch/agreement_gap (docs/runs.md); 0 = never."""
    batch_size: int = 64
    """Completions decoded together: the engine's slots (lean: refilled as rows finish; vLLM: max_num_seqs)."""
    engine: Literal["auto", "lean", "transformers", "vllm", "vllm_server"] = "auto"
    """What samples: lean (fused decode loop, continuous batching; the CPU default), transformers (its paged
    continuous batching), vllm (the thinkrl[vllm] extra), vllm_server (a `thinkrl serve` process at
    rollout.server_url, LoRA pushed after each update: docs/vllm_server.md); auto picks by device (docs/engines.md)."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    server_url: str = ""
    """rollout.engine=vllm_server: the vLLM server's address, e.g. http://127.0.0.1:8000 (started by `thinkrl serve`)."""
    adapter_dir: str = ""
    """rollout.engine=vllm_server: where the trainer writes the LoRA adapters the server loads, a directory both see
    (a shared filesystem when the server runs on another machine); empty = a temporary directory on this machine."""
    server_timeout: float = 600.0
    """rollout.engine=vllm_server: seconds to wait for one answer (a completion, an adapter load; 30 s at most for the
    health check at start); past it the run stops in one line, and --resume continues from the last checkpoint."""
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
            (0 < self.temperature < math.inf, f"temperature must be > 0 for training (sampling) and finite, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}"),
            (self.staleness >= 0, f"staleness must be >= 0 (0 = sample with the current policy), got {self.staleness}"),
            (self.agreement_every >= 0, f"agreement_every must be >= 0 (0 = never check), got {self.agreement_every}"),
            (self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}"),
            (self.max_sampling_rounds >= 1, f"max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}"),
            (0 < self.server_timeout <= MAX_TIMEOUT, f"server_timeout must be in (0, {MAX_TIMEOUT}] seconds, got {self.server_timeout}"),
            (
                self.engine != "vllm_server" or bool(self.server_url),
                "engine=vllm_server needs server_url, e.g. -o rollout.server_url=http://127.0.0.1:8000",
            ),
            (
                not self.server_url or _is_url(self.server_url),
                f"server_url must be http(s)://HOST:PORT, e.g. http://127.0.0.1:8000, got {short(self.server_url)}",
            ),
        )


def _is_url(text: str) -> bool:
    """http(s)://host[:port] with nothing after but an optional slash: the server's root, where /health and /v1 live."""
    return re.fullmatch(r"https?://[A-Za-z0-9._\-\[\]:]+(:\d{1,5})?/?", text) is not None


def server_refusal(cfg) -> str | None:
    """Why this run cannot sample with rollout.engine=vllm_server (a one-line fix), or None: the server is pushed LoRA
    adapters, so full fine-tuning, historical Thinking-Seeds policies and a quantised sampling copy are out."""
    r = cfg.rollout
    if r.engine != "vllm_server":
        return None
    refusals = [
        (
            cfg.model.lora.rank == 0,
            "model.lora.rank=0 (full fine-tuning): the server is sent LoRA adapters only; set model.lora.rank "
            "(e.g. 16) or use rollout.engine=vllm, which loads full weights in-process",
        ),
        (
            bool(cfg.seeds.enabled),
            "seeds.enabled samples prefixes with historical policies, which are not pushed to the server; use rollout.engine=vllm or lean",
        ),
        (
            r.precision in ("fp8", "fp4"),
            f"rollout.precision={r.precision} is not applied by the server; use same, bf16 or fp16 (thinkrl serve sets --dtype)",
        ),
    ]
    return next((f"rollout.engine=vllm_server with {why}" for bad, why in refusals if bad), None)


REWARD_KEYS = ("mean", "std", "shaped_mean", "seeded_mean", "unseeded_mean")  # reward/<key> metrics a function name would overwrite


@dataclass(repr=False)
class RewardFunction:
    """One entry of reward.functions, e.g. {name: format, function: thinkrl.rewards:format_boxed, weight: 0.1}."""

    name: str = ""
    """Logged as reward/<name> (its mean over the step's completions); letters, digits, _ . - only."""
    function: str = ""
    """'verifier' (the score of verifier.grader) or module:function (completion, answer, **options) -> a number,
    run in the verifier's workers; built-ins: thinkrl.rewards:format_boxed, format_think, length_penalty."""
    weight: float = 1.0
    """Its weight: the reward the advantages see is the sum of weight x value over reward.functions."""
    options: dict = field(default_factory=dict)
    """Keyword arguments for the function, e.g. {max_chars: 2000} for thinkrl.rewards:length_penalty."""

    def __post_init__(self) -> None:
        plain = re.fullmatch(r"[A-Za-z0-9_.-]+", self.name) is not None
        check(
            (plain, f"name must be letters, digits, _ . - (it names the metric reward/<name>), got {short(self.name)}"),
            (
                self.function == "verifier" or ":" in self.function,
                f"function must be 'verifier' or module:function, got {short(self.function)}",
            ),
            (math.isfinite(self.weight), f"weight must be a finite number, got {self.weight}"),
            (self.function != "verifier" or not self.options, f"options: 'verifier' takes none, got {short(self.options)}"),
        )

    def __repr__(self) -> str:
        """The YAML form, as `-o reward.functions=[...]` takes it (`thinkrl config` prints it)."""
        fields = {"name": self.name, "function": self.function, "weight": self.weight}
        if self.options:
            fields["options"] = self.options
        return yaml.safe_dump(fields, default_flow_style=True, sort_keys=False, width=1_000_000).strip()


def default_reward_functions() -> list[RewardFunction]:
    """The verifier's score with weight 1: the reward of a run that does not set reward.functions."""
    return [RewardFunction("correct", "verifier", 1.0)]


@dataclass
class RewardConfig:
    functions: list[RewardFunction] = field(default_factory=default_reward_functions)
    """Named, weighted rewards (TRL's reward_funcs + reward_weights): a list of {name, function, weight, options};
    reward/mean stays the verifier's accuracy, the advantages see the weighted sum (see thinkrl/verifier/rewards.py)."""
    overlong_buffer: float = 0
    """DAPO's soft overlong punishment: over the last N tokens of the budget the reward falls linearly by up to
    overlong_penalty; a value below 1 is a fraction of rollout.max_new_tokens (DAPO: 0.2); 0 = off."""
    overlong_penalty: float = 1.0
    """Largest overlong punishment, reached at rollout.max_new_tokens."""
    max_failure_share: float = 1.0
    """A reward function that fails (raises, exits, runs past verifier.timeout, kills its worker) on this share of the
    completions graded together or more stops the run; 1.0 = only when it fails on all of them. Fewer score 0."""

    def overlong_tokens(self, max_new_tokens: int) -> int:
        """overlong_buffer in tokens for a budget of max_new_tokens. Worked out where it is used, never stored back:
        config.yaml keeps a fraction as written, so a resume with another budget takes the same share of it."""
        buffer = self.overlong_buffer
        return max(1, int(buffer * max_new_tokens)) if 0 < buffer < 1 else int(buffer)

    def __post_init__(self) -> None:
        check(
            (0 <= self.overlong_buffer < math.inf, f"overlong_buffer must be >= 0 and finite (0 = off), got {self.overlong_buffer}"),
            (0 <= self.overlong_penalty < math.inf, f"overlong_penalty must be >= 0 and finite, got {self.overlong_penalty}"),
            (
                0 < self.max_failure_share <= 1,
                f"max_failure_share must be in (0, 1] (1: stop only when every call fails), got {self.max_failure_share}",
            ),
            (len(self.functions) >= 1, "functions must hold at least one {name, function, weight} (the default: the verifier)"),
        )
        names = [f.name for f in self.functions]
        check(
            *((names.count(n) == 1, f"functions: the name {n!r} is used twice; each needs its own (it names reward/{n})") for n in names),
            *((n not in REWARD_KEYS, f"functions: the name {n!r} would overwrite the metric reward/{n}; pick another") for n in names),
        )


MAX_TIMEOUT = 86_400  # seconds: a day per completion is no limit at all; past 2**31 ms (24 days) the pool's wait() overflows


@dataclass
class VerifierConfig:
    timeout: float = 5.0
    """Seconds a single completion may take to grade; past it the sample scores 0."""
    workers: int = 2
    """Grading worker processes."""
    grader: str = "thinkrl.verifier:grade"
    """module:function (completion, answer) -> (score in [0, 1], extracted answer or None), or a bare score, run in
    the workers; an exception scores 0 (verifier/errors), but one on every completion of a step stops the run."""

    def __post_init__(self) -> None:
        check(
            (0 < self.timeout <= MAX_TIMEOUT, f"timeout must be in (0, {MAX_TIMEOUT}] seconds (a day), got {self.timeout}"),
            (self.workers >= 1, f"workers must be >= 1, got {self.workers}"),
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
            (
                0 < self.frac_min <= self.frac_max <= 1,
                f"frac_min and frac_max need 0 < frac_min <= frac_max <= 1, got {self.frac_min} and {self.frac_max}",
            ),
            (
                1 <= self.tokens_min <= self.tokens_max,
                f"tokens_min and tokens_max need 1 <= tokens_min <= tokens_max, got {self.tokens_min} and {self.tokens_max}",
            ),
        )
