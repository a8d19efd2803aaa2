"""Outcome rewards (B,) -> advantages (B,), one group of G consecutive completions per prompt.

    grpo    A_i = (R_i - mean) / (std + eps)    sample std (N - 1), as verl and TRL
    no_std  A_i = R_i - mean                    Dr.GRPO
    rloo    A_i = R_i - mean of the other G - 1 rewards = G / (G - 1) * (R_i - mean)

A group whose rewards are all equal carries no signal: every estimator gives exactly 0 there, and the
fraction of such groups is reported as frac_reward_zero_std. A group of one gets A = R (verl's rule:
mean 0, std 1), except rloo, which needs G >= 2. Every estimator here is group-relative, so a training run
refuses rollout.group_size=1 before anything loads (thinkrl/config/load.py `resolve`): with no other completion
to compare with, it would train on the raw reward without a baseline, silently.
"""

from __future__ import annotations

import torch
from torch import Tensor

ESTIMATORS = ("grpo", "no_std", "rloo")


def compute_advantages(rewards: Tensor, group_size: int, estimator: str = "grpo", eps: float = 1e-6) -> tuple[Tensor, dict[str, float]]:
    """Return advantages (B,) and {'frac_reward_zero_std': ...}."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)  # (P, G)
    if group_size == 1:
        if estimator == "rloo":
            raise ValueError("rloo needs rollout.group_size >= 2")
        return r.view(-1).clone(), {"frac_reward_zero_std": 1.0}
    mean = r.mean(-1, keepdim=True)  # (P, 1)
    std = r.std(-1, keepdim=True)  # (P, 1), unbiased
    zero = (r == r[:, :1]).all(-1, keepdim=True)  # (P, 1) exactly equal rewards
    if estimator == "grpo":
        adv = (r - mean) / (std + eps)
    elif estimator == "no_std":
        adv = r - mean
    else:
        adv = (r - mean) * group_size / (group_size - 1)
    adv = torch.where(zero, torch.zeros_like(adv), adv)  # exact zeros, never float noise
    return adv.view(-1), {"frac_reward_zero_std": zero.float().mean().item()}
