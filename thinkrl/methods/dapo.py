"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization.

Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476.
Exact-from-code reference: verl `docs/algo/dapo.md` (vanilla policy loss), TRL loss_type `dapo`.
Confidence: EXACT-CODE (methods.md 2.4).

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    r     = pi_theta(y_t) / pi_old(y_t)
    l_t   = max(-r A_i, -clip(r, 1 - clip_low, 1 + clip_high) A_i)      (clip-higher: clip_high > clip_low)
    loss  = sum_i sum_t l_t / sum_i |y_i|                               (token-mean over the whole batch)

What it changes relative to grpo: a decoupled upper clip (0.28 instead of 0.2) so that low-probability
tokens with a positive advantage can still grow (against entropy collapse); token-level normalisation,
so every token weighs the same whatever its sequence's length; no KL term and no dual clip.

DAPO's other two changes act on the loop, not the loss, so they are trainer options (configs/dapo.yaml):
- dynamic sampling: `rollout.dynamic_sampling: true` drops groups whose rewards are all equal (zero
  advantage, no signal) and samples more prompts, `rollout.max_sampling_rounds: 3` rounds at most (verl
  caps it with max_num_gen_batches);
- soft overlong punishment: `reward.overlong_buffer: 16`, `reward.overlong_penalty: 1.0` lower the
  reward linearly over the last 16 tokens of the budget, by up to 1.0 at rollout.max_new_tokens (the
  paper: 4096 of 20480 tokens, here scaled to the 48-token default). Overlong filtering is `rollout.mask_truncated`, off as in the paper's recipe.

Defaults: clip_low 0.2, clip_high 0.28, token-mean, group-normalised advantages. The paper's G = 16,
512 prompts per step and lr 1e-6 (full fine-tuning) are left to the run config.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, check_common, clipped_surrogate, log_ratio, masked_mean, reduce, with_norm_length


@dataclass
class Config:
    clip_low: float = 0.2
    """Lower clip: the ratio is clipped at 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip (clip-higher): the ratio is clipped at 1 + clip_high."""
    aggregation: Aggregation = "token-mean"
    """How per-token losses become one scalar (methods.md 1.4); DAPO's token-level loss is token-mean."""
    norm_length: int = 0
    """Constant L for seq-mean-token-sum-norm; 0 = rollout.max_new_tokens."""

    def __post_init__(self) -> None:
        check_common(self)


@register("dapo")
class DAPO(Method):
    """Clip-higher (0.2/0.28), token-mean loss, no KL; dynamic sampling and overlong shaping in the trainer."""

    Config = Config

    def loss(self, batch):
        c, mask = self.cfg, batch.mask
        ratio = torch.exp(log_ratio(batch.logp, batch.old_logp))  # (B, T)
        per_token, clipped = clipped_surrogate(ratio, batch.advantages, c.clip_low, c.clip_high)  # (B, T)
        metrics = {
            "clip/frac": masked_mean(clipped, mask),
            "clip/low_frac": masked_mean(clipped & (ratio < 1), mask),
            "clip/high_frac": masked_mean(clipped & (ratio > 1), mask),
            "ratio/mean": masked_mean(ratio, mask),
        }
        # with_norm_length: L = padded T for seq-mean-token-sum-norm when called outside the trainer
        return reduce(per_token, batch, with_norm_length(c, batch)), metrics
