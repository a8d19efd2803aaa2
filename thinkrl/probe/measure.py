"""A one-step probe: from one starting point, what one update of each method does, over independent replicates.

The setup is the one where policy losses differ: a later mini-batch of an update phase, whose policy has moved
away from the one that sampled. The starting policy theta0 samples every rollout (so pi_old = mu = theta0), then
takes `stale_updates` grpo steps on a separate batch of `stale_prompts` groups (theta1). Replicate r takes its
own `groups` prompt groups, sampled for it alone (so replicates are independent), and each method's loss
gradient g at theta1 on them. Per replicate and method:

- grad_norm: |g|;
- cos_ref: the cosine of -g with a large-sample on-policy policy gradient at theta1 (fresh rollouts of theta1,
  REINFORCE with group advantages): how well the method's stale estimate points where the true gradient does;
- entropy_slope: dH/d(lr) of a plain gradient step theta1 - lr * g, with H the mean token entropy over the
  reference rollouts: -<grad H, g>, exact to first order (the entropy head has a gradient);
- kl_slope: the same for KL(theta0 || theta), the mean full-vocabulary KL from the starting policy over the
  reference rollouts' positions: does the update move further from pi_old or back towards it (0 when there
  are no stale steps: at theta0 the KL is at its minimum and changes only at second order);
- clip_frac: the share of tokens the method clipped or masked, when it reports one;
- entropy_slope_unit: entropy_slope / grad_norm, the entropy change along a step of unit length in the
  update's direction: methods whose gradients differ in size (ict trains on a tenth of the tokens) compared
  by where they point, as if each were given the learning rate that moves it as far.

pi_old is the sampler's own log-prob of each token (old_policy "sampler": theta0 sampled in the training
precision, so the two agree to rounding), or theta0's log-prob recomputed at the trainer's precision (old_policy
"recompute": with an fp8 sampler, mu != pi_old, which is what ais corrects). The reference is always sampled at
the trainer's precision. Every method sees the same replicate, so methods are compared pair by pair.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from thinkrl import accel
from thinkrl.config import Config
from thinkrl.learner import method_calls
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.logprobs import dropout_off
from thinkrl.methods import Method, get_method, method_class
from thinkrl.probe.rollouts import Rollouts

# what a probed loss may read beyond logp, old_logp, advantages, mask; "uniform" is left unset, and a loss that
# reads it draws from batch.generator instead (sis), as a direct call does
READS = frozenset({"entropy", "old_entropy", "token_ids", "token_js", "topk_ids", "topk_old_logp", "topk_logp", "uniform"})
CLIP_KEYS = ("clip/frac", "mask/frac", "masked/frac")
OLD_POLICIES = ("sampler", "recompute")


@dataclass(frozen=True)
class ProbeArm:
    """One probed update: a method with its own parameters, reported under `label`. `recipe`: the method's
    recipe's `method.*` values come first, as `thinkrl train --method NAME` would set them (its other keys are
    the regime, shared by every arm: they are not applied). A parameter written {drift: f} is f times the
    per-token log-ratio sd the stale steps left at the start (resolved per start)."""

    label: str
    method: str
    params: tuple[tuple[str, Any], ...] = ()
    recipe: bool = True

    def build(self) -> Method:
        return get_method(self.method, **dict(self.params))

    def resolved(self, max_new_tokens: int, drift: float) -> ProbeArm:
        """The arm with concrete parameters: its recipe's, then its own, drift-scaled values filled in and
        seq-mean-token-sum-norm's constant L (norm_length 0) set to the budget, as a run resolves it."""
        own = {k: float(v["drift"]) * drift if isinstance(v, dict) else v for k, v in self.params}
        given = {**(recipe_params(self.method) if self.recipe else {}), **own}
        if given.get("norm_length", getattr(get_method(self.method, **given).cfg, "norm_length", None)) == 0:
            given["norm_length"] = max_new_tokens
        return ProbeArm(self.label, self.method, tuple(sorted(given.items())), recipe=False)


def recipe_params(method: str) -> dict[str, Any]:
    """The method.* values of a method's recipe, as Config fields."""
    return {k.removeprefix("method."): v for k, v in method_class(method).recipe.items() if k.startswith("method.")}


def as_arm(arm: str | ProbeArm) -> ProbeArm:
    return arm if isinstance(arm, ProbeArm) else ProbeArm(arm, arm)


@dataclass(frozen=True)
class ProbeSettings:
    methods: tuple[str | ProbeArm, ...]
    replicates: int = 200  # per start
    starts: int = 1  # independent starting points: each its own start run, stale batch, reference and replicates
    groups: int = 1  # prompt groups per replicate, sampled for it alone
    stale_prompts: int = 8  # groups of the batch the stale steps train on
    stale_updates: int = 2  # grpo steps from the sampler (pi_old) to the probed policy
    reference_prompts: int = 32  # groups of the on-policy reference gradient and the entropy measurement
    seed: int = 0
    old_policy: str = "sampler"  # pi_old: the sampler's log-probs, or theta0's recomputed by the trainer ("recompute")

    def __post_init__(self) -> None:
        check_old_policy(self.old_policy, "old_policy")


def check_old_policy(value: Any, what: str) -> None:
    """One error for a bad old_policy, wherever it was given (`what`: the flag or the file's key)."""
    from thinkrl.errors import UserError

    if value not in OLD_POLICIES:
        raise UserError(f"{what} {value!r}: choose {' or '.join(OLD_POLICIES)}")


def check_method(method: Method) -> None:
    from thinkrl.errors import UserError

    extra = set(method.requires) - READS
    if extra:
        raise UserError(
            f"thinkrl probe cannot probe {method.name}: its loss reads {', '.join(sorted(extra))}, which the probe does not "
            f"build (it gives logp, old_logp, behav_logp, advantages, entropy, old_entropy, token_js, pi_old's top-K and token ids)"
        )


def flat_grad(loss: Tensor, params: list[Tensor], retain: bool) -> Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


@contextlib.contextmanager
def probe_pass(policy) -> Iterator[None]:
    """Around the probe's passes with gradients: dropout off and the update phase's CPU speed-ups, with the input
    gradients through packed copies of W^T too (accel.update_pass): hundreds of backward passes go through the
    same frozen weights, and the probe has room for the second copy that a training run does not."""
    with dropout_off(policy), accel.update_pass(policy, transposed=True):
        yield


def stale_steps(policy, params: list[Tensor], data: Rollouts, groups: Tensor, grpo: Method, cfg: Config, n: int) -> None:
    """theta0 -> theta1: n AdamW steps of grpo's loss on these groups (the earlier mini-batches of a phase), each
    accumulated over chunks with the batch's global counts."""
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, betas=tuple(cfg.train.adam_betas), weight_decay=cfg.train.weight_decay)
    rows = data.group_rows(groups)
    counts = {"num_tokens": int(data.s.comp.mask[rows].sum()), "num_seqs": len(rows)}
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        for chunk in data.chunks(groups):
            lp = data.logprobs(policy, chunk)
            loss, _ = method_calls.loss(grpo, data.batch(grpo, chunk, lp.logp, None, **counts))
            loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)


@torch.no_grad()
def log_ratio_sd(policy, data: Rollouts, groups: Tensor) -> float:
    """The sd over these groups' generated tokens of log pi_theta / pi_old at the weights now in place: the
    per-token drift of the stale steps (0 without any)."""
    parts = []
    for rows in data.chunks(groups):
        lp = data.logprobs(policy, rows).logp  # (b, T)
        m = data.s.comp.mask[rows, : lp.shape[1]].bool()
        parts.append((lp - data.old_logp[rows, : lp.shape[1]].to(lp.device))[m].double())
    x = torch.cat(parts)
    return float(x.std()) if len(x) > 1 else 0.0


@dataclass(frozen=True)
class Directions:
    """What each method's gradient is held against, at theta1 (flat, like the gradients)."""

    g_ref: Tensor  # the on-policy policy gradient (ascent)
    g_h: Tensor  # the gradient of the mean token entropy
    g_kl: Tensor  # the gradient of the mean KL from theta0
    g_h2: Tensor | None = None  # the gradient of the mean Renyi-2 entropy (when a measure needs it)


def directions(policy, params: list[Tensor], ref: Rollouts, theta0: list[Tensor] | None, renyi: bool = False) -> tuple[Directions, float]:
    """The reference directions from theta1's own rollouts, and KL(theta0 || theta1) there. theta0: the
    starting LoRA weights (None: theta1 is theta0, the KL and its gradient are 0). renyi: also the Renyi-2
    entropy's gradient (one more pass over the reference's full distributions)."""
    g_ref, g_h = reference(policy, params, ref)
    g_h2 = renyi2_gradient(policy, params, ref) if renyi else None
    if theta0 is None:
        return Directions(g_ref, g_h, torch.zeros_like(g_ref), g_h2), 0.0
    g_kl, kl = kl_from_start(policy, params, ref, theta0)
    return Directions(g_ref, g_h, g_kl, g_h2), kl


def renyi2_gradient(policy, params: list[Tensor], ref: Rollouts) -> Tensor:
    """The gradient at theta1 of the mean over ref's generated positions of the Renyi-2 entropy
    H2 = -log sum_v p(v)^2 of the tempered next-token distribution (what ICT's paper controls: it weighs the
    likely tokens, so a policy collapsing onto one token shows in it first)."""
    N, grad = int(ref.s.comp.mask.sum()), None
    for rows in ref.chunks():
        logp = ref.distribution(policy, rows)  # (n, V)
        h2 = -torch.logsumexp(2 * logp, dim=-1)  # (n,)
        g = flat_grad(h2.sum() / N, params, retain=False)
        grad = g if grad is None else grad + g
    return grad


@contextlib.contextmanager
def weights(params: list[Tensor], values: list[Tensor]) -> Iterator[None]:
    """Inside the block the parameters hold `values`; after it, what they held before."""
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)


def kl_from_start(policy, params: list[Tensor], ref: Rollouts, theta0: list[Tensor]) -> tuple[Tensor, float]:
    """The gradient at theta1 of the mean over ref's generated positions of KL(pi_theta0 || pi_theta) over the
    whole (tempered) vocabulary, and its value; chunk by chunk, theta0's distribution first (no grad)."""
    N, grad, total = int(ref.s.comp.mask.sum()), None, 0.0
    for rows in ref.chunks():
        with torch.no_grad(), weights(params, theta0):
            logp0 = ref.distribution(policy, rows)  # (n, V)
        logq = ref.distribution(policy, rows)  # (n, V)
        kl = (logp0.exp() * (logp0 - logq)).sum() / N
        g = flat_grad(kl, params, retain=False)
        grad, total = g if grad is None else grad + g, total + float(kl.detach())
    return grad, total


def reference(policy, params: list[Tensor], ref: Rollouts) -> tuple[Tensor, Tensor]:
    """(g_ref, grad H) at theta1 from its own fresh rollouts: the on-policy policy gradient (ascent direction of
    A * log pi, sequence mean of token means) and the gradient of the mean token entropy, summed over chunks."""
    adv, _ = compute_advantages(ref.s.rewards, ref.s.group_size, "grpo")  # (B,)
    mask = ref.s.comp.mask
    B, N = mask.shape[0], int(mask.sum())
    g_ref = g_h = None
    for rows in ref.chunks():
        lp = ref.logprobs(policy, rows, entropy_grad=True)
        m = mask[rows, : lp.logp.shape[1]]
        per_seq = (lp.logp * m).sum(-1) / m.sum(-1).clamp(min=1)  # (b,)
        objective = (adv[rows].to(per_seq.device) * per_seq).sum() / B
        a = flat_grad(objective, params, retain=True)
        h = flat_grad((lp.entropy * m).sum() / N, params, retain=False)
        g_ref, g_h = (a, h) if g_ref is None else (g_ref + a, g_h + h)
    return g_ref, g_h
