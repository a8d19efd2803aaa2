"""What the policy losses share: the config bases, the clipped surrogate, the sequence ratio, aggregation.

A method file holds its Config (a subclass of `Reduction` or `ClipConfig` that overrides defaults and adds
its own fields) and its loss, which usually ends with `reduce(per_token, batch, cfg)`. Tensor helpers that
the trainer uses too (masked_mean, log_ratio, masked_quantile, js_divergence, ...) live in thinkrl/ops.py
and are re-exported here, so `from thinkrl.methods._common import masked_mean` keeps working for plugins.

Notation (see thinkrl/batch.py): B sequences, T completion positions. Every per-token tensor is (B, T)
and has already been zero-filled at mask == 0 positions by TokenBatch, so nothing here can leak junk from
padding into the loss or the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.ops import (  # noqa: F401  (re-exported for plugins)
    LOG_RATIO_LIMIT,
    exclusive_cumsum,
    js_divergence,
    log_ratio,
    masked_mean,
    masked_quantile,
    valid_positions,
)

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
LOG_SEQ_RATIO_MAX = 10.0  # verl's cap on GSPO's log s_it, so exp cannot overflow


# ---------------------------------------------------------------- config bases


@dataclass
class Reduction:
    """The fields of every method that ends with `reduce()`."""

    aggregation: Aggregation = "seq-mean-token-mean"
    """How per-token losses become one scalar: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    norm_length: int = 0
    """Constant L for seq-mean-token-sum-norm; 0 = rollout.max_new_tokens."""

    def __post_init__(self) -> None:
        if self.norm_length < 0:
            raise ValueError(f"norm_length must be >= 0 (0 = rollout.max_new_tokens), got {self.norm_length}")


@dataclass
class Clip:
    """PPO's ratio window [1 - clip_low, 1 + clip_high] and an optional dual clip."""

    clip_low: float = 0.2
    """Lower clip: the ratio is clipped at 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip: the ratio is clipped at 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    dual_clip: float = 0.0
    """Dual-clip ratio c > 1 for negative advantages: the loss is capped at -c A (verl uses 3); 0 = off."""

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)  # Reduction's, in ClipConfig
        if parent is not None:
            parent()
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            if value is not None and not value >= 0:  # None: a host's value, filled in by the subclass
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.dual_clip and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or 0 = off), got {self.dual_clip}")


@dataclass
class ClipConfig(Clip, Reduction):
    """The clipped host: GRPO's surrogate and a reduction. Methods built on it subclass this and override
    only the defaults they change."""


@dataclass
class AnchoredConfig(Reduction):
    """Methods whose trust region is measured against mu, the sampler (DPPO, CPPO, DRPO)."""

    anchor: Literal["behav", "old"] = "behav"
    """mu: behav = the sampler's log-probs (bypass mode, the papers' choice); old = pi_old (the recompute or
    "replay" variant)."""


def anchored_ratio(batch: TokenBatch, cfg: AnchoredConfig) -> tuple[Tensor, Tensor]:
    """r = pi_theta / mu (B, T), differentiable, and log mu (B, T), detached, for cfg.anchor."""
    anchor = batch.behav_logp if cfg.anchor == "behav" else batch.old_logp
    return log_ratio(batch.logp, anchor).exp(), anchor


@dataclass
class HostedConfig(ClipConfig):
    """A plug-in on a clipped host method (sis, thinking_seeds): clip_low, clip_high and, where a subclass
    leaves it None, aggregation default to the host's own Config. Subclasses declare `host`, a Literal of
    the host method names they accept."""

    clip_low: float | None = None  # type: ignore[assignment]  (None until __post_init__ fills in the host's)
    """Lower clip, at 1 - clip_low; None = the host's."""
    clip_high: float | None = None  # type: ignore[assignment]
    """Upper clip, at 1 + clip_high; None = the host's."""

    def __post_init__(self) -> None:
        import typing

        name = getattr(self, "host")  # noqa: B009  (declared by each subclass, with its own choices)
        hosts = typing.get_args(typing.get_type_hints(type(self))["host"])
        if name not in hosts:
            raise ValueError(f"host must be one of {', '.join(hosts)}, got {name!r}")
        host = host_config(name)
        # resolved here, so config_dict() and the run's saved config show the values actually used
        for name in ("clip_low", "clip_high", "aggregation"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(host, name))
        super().__post_init__()
        if not 0 <= self.clip_low <= 1:  # type: ignore[operator]
            raise ValueError(f"clip_low must be in [0, 1] (the lower bound 1 - clip_low stays >= 0), got {self.clip_low}")


def host_config(name: str) -> ClipConfig:
    """The default Config of a clipped host method (grpo, dapo, gspo)."""
    from thinkrl.methods import method_class  # late: the registry imports every method module

    cfg = method_class(name).Config()
    if not isinstance(cfg, ClipConfig):
        raise ValueError(f"{name} is not a clipped host method")
    return cfg


# ---------------------------------------------------------------- surrogates


def clipped_surrogate(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """PPO per-token loss max(-r A, -clip(r, 1-lo, 1+hi) A) and where the clipped branch won.

    When the clipped branch is the max its value is constant in r, so that token's gradient is exactly 0.
    """
    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def dual_clip(per_token: Tensor, adv: Tensor, c: float | Tensor) -> tuple[Tensor, Tensor]:
    """For A < 0 cap the loss at -c A (ratio c), verl's dual clip; returns the loss and where it applied."""
    cap = -adv * c  # (B, T)
    hit = (adv < 0) & (per_token > cap)
    return torch.where(hit, cap, per_token), hit


def clip_metrics(clipped: Tensor, ratio: Tensor, mask: Tensor, ratio_key: str | None = "ratio/mean") -> dict[str, Tensor]:
    """clip/frac (share of valid tokens whose gradient the clip removed), split by side, and the mean ratio."""
    metrics = {
        "clip/frac": masked_mean(clipped, mask),
        "clip/low_frac": masked_mean(clipped & (ratio < 1), mask),
        "clip/high_frac": masked_mean(clipped & (ratio > 1), mask),
    }
    if ratio_key:
        metrics[ratio_key] = masked_mean(ratio, mask)
    return metrics


def clipped_loss(
    ratio: Tensor, batch: TokenBatch, cfg: Clip, trained: Tensor | None = None, ratio_key: str | None = "ratio/mean"
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The clipped host's per-token loss (B, T) with its dual clip, where the clip removed the gradient
    (B, T), and the clip metrics. `trained` (B, T): the tokens a selecting method keeps, so clip/* counts
    only gradient the clip really removed."""
    adv, mask = batch.advantages, batch.mask
    per_token, clipped = clipped_surrogate(ratio, adv, cfg.clip_low, cfg.clip_high)  # (B, T)
    if trained is not None:
        clipped = clipped & trained
    metrics = clip_metrics(clipped, ratio, mask, ratio_key)
    if cfg.dual_clip:
        per_token, hit = dual_clip(per_token, adv, cfg.dual_clip)  # (B, T)
        metrics["clip/dual_frac"] = masked_mean(hit, mask)
    return per_token, clipped, metrics


def sequence_ratio(log_r: Tensor, logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """GSPO's token-form sequence ratio s_it (B, T) and log s_i (B,), detached.

    log s_i = the mean of sequence i's token log-ratios over its own mask (micro-batches split rows, never
    positions, so it does not depend on the cut); s_it has the value s_i at every token and the gradient of
    log pi_theta(y_t), capped at log s_it <= 10 so exp cannot overflow."""
    log_s = torch.where(mask, log_r.detach(), 0.0).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
    log_s_tok = (log_s[:, None] + logp - logp.detach()).clamp(max=LOG_SEQ_RATIO_MAX)  # (B, T)
    return torch.exp(log_s_tok), log_s


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || ref): ref/pi - log(ref/pi) - 1, clamped to [-10, 10].  # (B, T)"""
    d = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)


# ---------------------------------------------------------------- aggregation


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: Aggregation,
    num_tokens: int,
    num_seqs: int,
    norm_length: int | None = None,
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    num_tokens / num_seqs are global counts over the whole update batch, so summing the results of
    micro-batches reproduces the full-batch value exactly, however the batch was split.
    """
    per_token = torch.where(mask, per_token, 0.0)  # (B, T)
    if mode == "token-mean":
        return per_token.sum() / max(num_tokens, 1)
    if mode == "seq-mean-token-mean":
        per_seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
        return per_seq.sum() / max(num_seqs, 1)
    if mode == "seq-mean-token-sum":
        return per_token.sum() / max(num_seqs, 1)
    if mode == "seq-mean-token-sum-norm":
        if not norm_length:
            raise ValueError("seq-mean-token-sum-norm needs norm_length (the constant L)")
        return per_token.sum() / (max(num_seqs, 1) * norm_length)
    raise ValueError(f"unknown aggregation {mode!r}")


def whole_batch(x: Tensor, batch: TokenBatch) -> tuple[Tensor, int]:
    """x (n,), values of this call's tokens in row-major order, extended to the whole batch the statistic is
    over: with several processes holding parts of one mini-batch (batch.gather), every process's values in rank
    order, which is their order in one process's batch, and where this call's start. (N,), offset."""
    return batch.gather(x) if batch.gather is not None else (x, 0)


def batch_quantile(values: Tensor, batch: TokenBatch, q: float) -> Tensor:
    """The q-quantile of a per-token statistic over the valid tokens of the whole batch (whole_batch)."""
    pooled, _ = whole_batch(values.detach()[batch.mask], batch)  # (N,)
    return masked_quantile(pooled, torch.ones_like(pooled, dtype=torch.bool), q)


def batch_covariance(batch: TokenBatch, *extra: Tensor) -> tuple[Tensor, int, list[Tensor]]:
    """The entropy-mechanism paper's per-token covariance (A_t - mean A)(log pi_t - mean log pi), means over the
    valid tokens of the whole batch (every process's part, whole_batch), detached: (N,) in row-major order over
    the valid tokens, and where this call's tokens start in it (Clip-Cov and KL-Cov select tokens by it).
    `extra`: more (B, T) per-token values the caller needs over the whole batch, pooled in the same collective
    (one gather per loss call, not one per value): (N,) each, in the same order."""
    columns = [x.detach()[batch.mask].float() for x in (batch.advantages, batch.logp, *extra)]  # k x (n,)
    pooled, offset = whole_batch(torch.stack(columns, dim=-1), batch)  # (N, k)
    adv, logp, *rest = pooled.unbind(-1)  # (N,) each
    return (adv - adv.mean()) * (logp - logp.mean()), offset, rest


def local_tokens(chosen: Tensor, offset: int, mask: Tensor) -> Tensor:
    """(B, T) bool: the valid tokens of this call among `chosen`, positions in the whole batch's (N,) order."""
    n = int(mask.sum())
    local = chosen[(chosen >= offset) & (chosen < offset + n)] - offset
    flat = torch.zeros(n, dtype=torch.bool, device=mask.device)
    flat[local.to(mask.device)] = True
    out = torch.zeros_like(mask, dtype=torch.bool)
    out[mask] = flat
    return out


def reduce(per_token: Tensor, batch: TokenBatch, cfg: Reduction, unweighted: Tensor | None = None) -> Tensor:
    """The last line of a method's loss: apply the rollout-correction weights, then aggregate.

    `batch.is_weights` (TIS/MIS, set by the trainer from the `correction` config) multiplies the per-token
    loss, so the correction works with any method. `unweighted` (B, T) is added after the weights: terms
    that regularise pi_theta itself rather than estimate the policy gradient under the sampler (grpo's KL to
    the reference), which must not carry pi_old / mu weights (as in verl and TRL). norm_length 0 means the
    padded length T: the trainer's config resolution replaces it with rollout.max_new_tokens before any loss
    runs, so the fallback serves direct calls (tests, notebooks) and is verl's default constant;
    micro-batches cut along B keep T.
    """
    if batch.is_weights is not None:
        per_token = per_token * batch.is_weights
    if unweighted is not None:
        per_token = per_token + unweighted
    norm_length = cfg.norm_length or batch.mask.shape[-1]
    return aggregate(per_token, batch.mask, cfg.aggregation, batch.num_tokens or 0, batch.num_seqs or 0, norm_length)
