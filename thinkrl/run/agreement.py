"""The sampler-trainer agreement check: does the engine sample the distribution the trainer scores?

In the regime where they must agree to rounding (the sampling copy holds the trainer's weights, perhaps cast to
bf16 / fp16; no staleness; the sampler's distribution is untruncated softmax(logits / temperature)), the
behaviour log-probs the engine recorded and the trainer's log-probs of the same tokens under the same weights
differ only by float rounding. The update phase measures that gap (mismatch/agreement_gap: mean |log pi - log mu|
over the tokens sampled now, scored before any optimizer step; thinkrl/learner/update.py); this module checks it
on step 1 and every rollout.agreement_every steps, keeps the metric on those steps, and warns once when it is
past the dtype's threshold: an engine that drops an attention feature, or a kernel or dtype that differs, trains
on ratios that are not 1 where every method assumes they are.
"""

from __future__ import annotations

import math

import torch
from rich.markup import escape

from thinkrl.config import Config
from thinkrl.run.console import console

KEY = "mismatch/agreement_gap"

# Mean |log ratio| allowed per dtype of the comparison. Measured with the bundled SmolLM2-135M between the lean
# sampler and the trainer: 1e-6 to 1e-5 in float32, 0.033-0.040 in bfloat16, 0.030-0.037 with a bf16 sampling
# copy (rollout.precision=bf16) of a float32 trainer. float32: 1e-3 is 100x the honest gap or more, yet a dropped
# feature (Gemma-2's attention soft-capping on transformers' paged path: 0.015 on a tiny model) is past it. Half
# precision: 0.1 is 2.5x bf16's honest gap, so bf16 rounding never fires it; fp16 keeps 3 more mantissa bits than
# bf16, so its honest gap is smaller still.
THRESHOLDS = {torch.float64: 1e-3, torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.1}
HALF = 0.1  # any other dtype: the loosest threshold


def threshold(dtype: torch.dtype) -> float:
    """The largest mean |log ratio| honest rounding in `dtype` gives (THRESHOLDS)."""
    return THRESHOLDS.get(dtype, HALF)


def exceeds(gap: float, dtype: torch.dtype) -> bool:
    """Whether a measured gap is more than `dtype`'s rounding can explain (a NaN gap measured nothing)."""
    return gap > threshold(dtype)


def comparison_dtype(model) -> torch.dtype:
    """The dtype the sampling copy computes in: its lowest-precision floating weights (a bf16 base under float32
    LoRA adapters compares at bf16; rollout.precision=bf16 casts the copy)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return min(dtypes, key=lambda d: torch.finfo(d).bits, default=torch.float32)


def off_because(cfg: Config) -> str | None:
    """Why this run's sampler and trainer need not agree to rounding (the check is off), or None."""
    r = cfg.rollout
    reasons = [
        (r.agreement_every == 0, "rollout.agreement_every=0"),
        (r.precision in ("fp8", "fp4"), f"rollout.precision={r.precision} quantises the sampler's weights"),
        (r.staleness > 0, "rollout.staleness samples with older weights"),
        (r.top_p < 1 or r.top_k > 0, "top_p / top_k truncate the sampler's distribution, not the trainer's"),
        (r.min_new_tokens > 0, "min_new_tokens suppresses EOS while sampling"),
    ]
    return next((why for off, why in reasons if off), None)


class AgreementCheck:
    """One per run: `check(step, upd)` after each update; the warning comes at most once per process."""

    def __init__(self, cfg: Config, engine: str, decoder: str, dtype: torch.dtype) -> None:
        self.every, self.off = cfg.rollout.agreement_every, off_because(cfg)
        self.engine, self.decoder, self.dtype = engine, decoder, dtype
        self.checked = self.warned = False

    def check(self, step: int, upd: dict) -> None:
        """Keep upd's agreement gap on a checked step (step 1, every N, or the first with an update), drop it
        otherwise; warn once when it is past the threshold."""
        gap = upd.pop(KEY, None)
        due = not self.checked or step % max(self.every, 1) == 0
        if self.off is not None or gap is None or not due or math.isnan(gap):
            return
        self.checked = True
        upd[KEY] = gap
        if exceeds(gap, self.dtype) and not self.warned:
            self.warned = True
            console.print(escape(self.warning(step, gap)), soft_wrap=True, style="yellow")

    def warning(self, step: int, gap: float) -> str:
        others = " or ".join(f"rollout.engine={e}" for e in ("lean", "transformers", "vllm") if e != self.engine)
        dtype = str(self.dtype).removeprefix("torch.")
        return (
            f"warning: sampler and trainer disagree: mean |log ratio| {gap:.3g} on step {step} is past the {threshold(self.dtype):g} "
            f"that {dtype} rounding stays under, sampling with engine {self.engine} ({self.decoder}); the engine computes a different "
            f"distribution than the trainer (an attention feature its kernels drop, a dtype or kernel difference), so every ratio "
            f"is off; try {others} (logged as {KEY})"
        )
