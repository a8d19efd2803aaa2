"""The metrics a study's runs can log, so a declared metric that none logs is refused before anything runs.

Methods do not declare their metrics, so the set is built from what is there to read:

- the trainer's own keys (TRAINER: every step's record, the update phase, sampling, Thinking Seeds, rollout
  correction), plus reward/NAME for each of the run's reward.functions entries;
- key families whose names depend on the run's settings and engine: eval/* (evaluation sets), generate/* and
  rollout/* (the sampling engine);
- each arm's method's own keys: its begin_step() and loss() are called once, with the arm's resolved method
  settings, on a small synthetic batch that carries every optional field, and the metric names returned are
  kept. A method whose call fails on that batch makes its keys unknown, and then no name outside the trainer's
  is refused (a check that cannot know must not block a study).
"""

from __future__ import annotations

from typing import Any

from thinkrl.errors import UserError
from thinkrl.study.spec import Arm, Study

TRAINER = frozenset(
    "step reward/mean reward/std reward/shaped_mean length/mean length/max length/min length/truncated_frac "
    "frac_reward_zero_std loss entropy grad_norm tokens/s lr torch/threads answers/distinct_per_group "
    "update/optimizer_steps update/skipped_nonfinite update/entropy_bonus time/update time/step time/generate "
    "time/score time/eval verifier/timeouts verifier/crashes verifier/errors sampling/dropped_groups "
    "sampling/kept_groups sampling/rounds seeds/pool_size seeds/prefix_len_mean seeds/seeded_frac "
    "reward/seeded_mean reward/unseeded_mean mismatch/abs_log_ratio mismatch/k3 mismatch/ratio_gt2_frac "
    "mismatch/agreement_gap correction/weight_mean correction/zero_frac".split()
)
FAMILIES = ("eval/", "generate/", "rollout/")


def check_metrics(study: Study, where: str) -> None:
    """One UserError naming the first declared metric that no arm's run can log, with the known names."""
    known, complete = set(TRAINER), True
    for arm in study.arms:
        cfg = arm_config(study, arm)
        if cfg is None:  # its run will fail and say why; its method's own keys at their defaults meanwhile
            keys = method_keys(arm.method, {})
        else:
            known |= {f"reward/{_name(e)}" for e in cfg.reward.functions if _name(e)}
            keys = method_keys(cfg.method.name, dict(cfg.method.params))
        complete = complete and keys is not None
        known |= keys or set()
    for m in study.metrics:
        if m.name in known or m.name.startswith(FAMILIES) or not complete:
            continue
        raise UserError(
            f"{where}: metric {m.name!r} is logged by no arm (not a trainer metric, nor one that the arms' methods return); "
            f"known: {', '.join(sorted(known))}, and eval/*, generate/*, rollout/* keys"
        )


def arm_config(study: Study, arm: Arm):
    """The arm's config as its run loads it (file, recipe, overrides), or None when loading it fails: that run then
    fails with the error itself, reported like any failed run."""
    from thinkrl.settings import load_config, recipe_flag

    overrides = [*study.overrides, *arm.overrides]
    try:
        return load_config(study.config, overrides, recipe=recipe_flag(study.recipe, False), **{"method.name": arm.method})
    except UserError:
        return None


def _name(entry: Any) -> str | None:
    return entry.get("name") if isinstance(entry, dict) else getattr(entry, "name", None)


def method_keys(name: str, params: dict) -> set[str] | None:
    """The metric names a method's begin_step() and loss() return on a synthetic batch; None when the call fails."""
    import torch

    from thinkrl.batch import TokenBatch
    from thinkrl.methods import get_method

    try:
        method = get_method(name, **params)
        g = torch.Generator().manual_seed(0)
        B, T, K = 4, 5, 3
        mask = torch.ones(B, T, dtype=torch.bool)
        mask[0, 3:] = False
        logp = (-torch.rand(B, T, generator=g) * 3 - 0.05).requires_grad_()
        old = (logp.detach() + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
        fields = dict(
            old_logp=old,
            behav_logp=(old + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-0.01),
            advantages=torch.tensor([1.0, -0.5, 0.7, -1.2])[:, None].expand(B, T).clone(),
            mask=mask,
            token_ids=torch.randint(0, 50, (B, T), generator=g),
            prefix_mask=torch.zeros(B, T, dtype=torch.bool).index_fill(1, torch.tensor([0]), True),
            old_entropy=torch.rand(B, T, generator=g) * 2,
            ref_logp=(old + 0.1 * torch.randn(B, T, generator=g)).clamp(max=-0.01),
            topk_ids=torch.randint(0, 50, (B, T, K), generator=g),
            topk_old_logp=torch.log_softmax(torch.randn(B, T, K, generator=g), -1),
            token_js=torch.rand(B, T, generator=g) * 0.69,
        )
        view = TokenBatch(logp=logp.detach(), **{**fields, "old_logp": logp.detach()})
        keys = set(method.begin_step(view))
        topk = torch.log_softmax(torch.randn(B, T, K, generator=g), -1).requires_grad_()
        batch = TokenBatch(
            logp=logp, entropy=torch.rand(B, T, generator=g) * 2, topk_logp=topk, num_tokens=int(mask.sum()), num_seqs=B,
            generator=g, uniform=torch.rand(B, T, generator=g), **fields,
        )  # fmt: skip
        return keys | set(method.loss(batch)[1])
    except Exception:  # a plugin that cannot run on this batch: its keys are unknown, not refused
        return None
