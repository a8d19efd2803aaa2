"""Config sections of the learner stage: advantages, rollout-mismatch correction, the optimisation itself."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from thinkrl.config.typecheck import check
from thinkrl.errors import short


@dataclass
class AdvantageConfig:
    estimator: Literal["auto", "grpo", "no_std", "rloo"] = "auto"
    """auto = the method's own choice; grpo = (r-mean)/(std+eps); no_std = r-mean (Dr.GRPO); rloo = leave-one-out."""
    eps: float = 1e-6
    """Added to the group std (grpo estimator)."""

    def __post_init__(self) -> None:
        check((0 <= self.eps < math.inf, f"eps must be >= 0 and finite, got {self.eps}"))


@dataclass
class CorrectionConfig:
    mode: Literal["none", "tis", "mis", "icepop", "ipo"] = "none"
    """Rollout-mismatch correction with rho = pi_old / mu, for every method: tis truncates the weight at c_max;
    mis masks tokens (or sequences) whose rho falls outside [c_min, c_max]; icepop masks tokens whose rho leaves
    `band` (Ring-1T's IcePop); ipo masks tokens whose probabilities under pi_old and mu differ by more than `eps`
    (prime-rl's IPO mask). Kept tokens are weighted by rho (docs/off_policy.md)."""
    level: Literal["token", "sequence"] = "token"
    """token: rho per token; sequence: the product of a sequence's token ratios, one weight per sequence
    (tis and mis; icepop and ipo are per token)."""
    c_max: float = 2.0
    """Upper threshold (TIS cap, MIS upper bound)."""
    c_min: float = 0.0
    """Lower threshold (MIS only)."""
    band: list[float] = field(default_factory=lambda: [0.5, 5.0])
    """IcePop's [alpha, beta]: a token whose rho lies outside is masked (the Ring-1T report's 0.5 and 5)."""
    eps: float = 0.1
    """IPO's mask: a token with |pi_old(y) - mu(y)| > eps (probabilities, not ratios) is masked (prime-rl's 0.1)."""

    def __post_init__(self) -> None:
        check(
            (
                0 <= self.c_min < self.c_max < math.inf,
                f"c_min and c_max need 0 <= c_min < c_max, both finite, got {self.c_min} and {self.c_max}",
            ),
            (
                len(self.band) == 2 and 0 <= self.band[0] < self.band[1] < math.inf,
                f"band needs two numbers 0 <= alpha < beta, got {self.band}; e.g. correction.band=[0.5,5.0]",
            ),
            (0 < self.eps <= 1, f"eps is a probability difference in (0, 1], got {self.eps}"),
            (
                self.level == "token" or self.mode not in ("icepop", "ipo"),
                f"mode={self.mode} masks single tokens: set correction.level=token (sequence is for tis / mis)",
            ),
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
    entropy_coef: float = 0.0
    """Entropy bonus: the loss minus entropy_coef x the mean token entropy (verl's entropy_coeff); 0 = off."""
    micro_batch_tokens: int = 2048
    """Cap on padded completion tokens per forward/backward pass (0 = none): long completions get fewer
    rows per micro-batch (memory only: the result does not depend on it). On the CPU at 16 x 1,024 tokens,
    passes of 2 rows instead of 4 took the same time per row and peaked about 0.35 GB lower (docs/benchmarks.md)."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute each decoder layer in the backward instead of keeping its activations: far less memory for
    long completions, about one more forward of update time. The same operations run on the same inputs, so
    values and gradients do not change (to the bit). auto = for a micro-batch whose activations would exceed
    1 GiB (thinkrl/learner/logprobs.py: activation_bytes), on the CPU keeping for the replay as many LoRA
    linear-layer outputs as the rest of the 1 GiB holds (thinkrl/accel/kept_outputs.py); true keeps none."""
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
            (0 < self.lr < math.inf, f"lr must be > 0 and finite, got {self.lr}"),
            (self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}"),
            (0 <= self.weight_decay < math.inf, f"weight_decay must be >= 0 and finite, got {self.weight_decay}"),
            (len(self.adam_betas) == 2, f"adam_betas needs two values, got {short(self.adam_betas)}"),
            (all(0 <= b < 1 for b in self.adam_betas), f"adam_betas must each be in [0, 1), got {short(self.adam_betas)}"),
            (0 <= self.grad_clip < math.inf, f"grad_clip must be >= 0 and finite (0 = off), got {self.grad_clip}"),
            (0 <= self.entropy_coef < math.inf, f"entropy_coef must be >= 0 and finite (0 = off), got {self.entropy_coef}"),
            (self.micro_batch_tokens >= 0, f"micro_batch_tokens must be >= 0 (0 = no cap), got {self.micro_batch_tokens}"),
            (self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}"),
            (self.mini_batches >= 1, f"mini_batches must be >= 1, got {self.mini_batches}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.save_every >= 0, f"save_every must be >= 0 (0 = only at the end), got {self.save_every}"),
            (self.keep_last >= 0, f"keep_last must be >= 0 (0 = keep all), got {self.keep_last}"),
            (self.max_nonfinite_steps >= 0, f"max_nonfinite_steps must be >= 0 (0 = never stop), got {self.max_nonfinite_steps}"),
        )
