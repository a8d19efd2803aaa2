"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization.

Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476.
Exact-from-code reference: verl `docs/algo/dapo.md` (vanilla policy loss), TRL loss_type `dapo`.
Confidence: EXACT-CODE (docs/methods.md, dapo).

Objective (minimised), per token t of completion i with group-normalised advantage A_i:

    r     = pi_theta(y_t) / pi_old(y_t)
    l_t   = max(-r A_i, -clip(r, 1 - clip_low, 1 + clip_high) A_i)      (clip-higher: clip_high > clip_low)
    loss  = sum_i sum_t l_t / sum_i |y_i|                               (token-mean over the whole batch)

What it changes relative to grpo: a decoupled upper clip (0.28 instead of 0.2) so that low-probability
tokens with a positive advantage can still grow (against entropy collapse); token-level normalisation,
so every token weighs the same whatever its sequence's length; no KL term and no dual clip.

DAPO's other two changes act on the loop, not the loss, so they are trainer options, set by its recipe:
- dynamic sampling: `rollout.dynamic_sampling: true` drops groups whose rewards are all equal (zero
  advantage, no signal) and samples more prompts, `rollout.max_sampling_rounds: 3` rounds at most (verl
  caps it with max_num_gen_batches);
- soft overlong punishment: `reward.overlong_buffer: 0.2`, `reward.overlong_penalty: 1.0` lower the
  reward linearly over the last fifth of the budget, by up to 1.0 at rollout.max_new_tokens (the
  paper: 4096 of 20480 tokens). Overlong filtering is
  `rollout.mask_truncated`, off as in the paper's recipe.

Defaults: clip_low 0.2, clip_high 0.28, token-mean, group-normalised advantages. The paper's G = 16,
512 prompts per step and lr 1e-6 (full fine-tuning) are left to the run config.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, ClipConfig, clipped_loss, log_ratio, reduce


@dataclass
class Config(ClipConfig):
    clip_high: float = 0.28
    aggregation: Aggregation = "token-mean"


@register("dapo")
class DAPO(Method[Config]):
    """Clip-higher (0.2/0.28), token-mean loss, no KL; dynamic sampling and overlong shaping in the trainer."""

    # the loop half of DAPO: dynamic sampling and the soft overlong punishment over the last fifth of the budget
    recipe = {
        "rollout.dynamic_sampling": True,
        "rollout.max_sampling_rounds": 3,
        "reward.overlong_buffer": 0.2,
        "reward.overlong_penalty": 1.0,
    }

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, self.cfg)  # (B, T)
        return reduce(per_token, batch, self.cfg), metrics
