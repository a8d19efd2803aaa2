"""AIS: Adaptive Importance Sampling for quantized rollouts.

Paper: "AIS: Adaptive Importance Sampling for Quantized RL", arXiv 2605.13907 (J. Zhou et al.).
Confidence: INTERPRETATION (docs/methods.md, ais). Only the abstract could be read: the three diagnostic
names (weight reliability, divergence severity, variance amplification) and the interpolation between the
uncorrected and the importance-weighted gradient are EXACT-PAPER; every formula and constant below is the
project's reading of them, not the published equations.

FP8 rollouts with a higher-precision trainer make the sampler mu differ from the trainer's pi_old. Early on
the mismatch acts as exploration; later it is bias. Once per step AIS measures the mismatch of the whole
rollout batch and picks how much importance correction to apply. Objective (minimised):

    begin_step, over the N valid tokens of the step's rollout batch (INTERPRETATION):
      rho_t  = exp(clip(log pi_old(y_t) - log mu(y_t), -20, 20)), capped at safe_cap (10) for the statistics
      R      = ESS / N = (sum rho)^2 / (N sum rho^2)                    weight reliability
      K      = mean(rho - 1 - log rho)   (k3 estimate of KL(mu || pi_old));  S = 1 - exp(-K / kappa)   severity
      V      = Var(rho A) / Var(A)  (population variances; V = 1 when Var(A) = 0);  P = 1 / max(1, V)
      alpha  = clip(S R P, 0, 1);  optionally alpha <- ema alpha_prev + (1 - ema) alpha (first step: alpha)
    loss, per call:
      r      = pi_theta(y_t) / pi_old(y_t)
      l_t    = max(-r A, -clip(r, 1 - clip_low, 1 + clip_high) A)          (host GRPO surrogate)
      w_t    = (1 - alpha) + alpha min(rho_t, cap)                         (detached)
      loss   = aggregate(w_t l_t)                                          (seq-mean-token-mean, as grpo)

The gradient is linear in w, so this is (1 - alpha) g_uncorrected + alpha g_TIS: alpha = 0 is grpo, alpha = 1
token-level TIS with C = cap. Small mismatch -> small K -> alpha near 0 (the exploration bonus is kept);
large mismatch with reliable weights -> alpha near 1; heavy-tailed weights -> alpha shrinks.
Defaults (suggested, not published): cap 2, kappa 0.05, safe_cap 10, no EMA (0.9 when on), token-level R;
host grpo clip 0.2 / 0.2, no dual clip, seq-mean-token-mean.
Relative to grpo: the per-step alpha and the detached weight w_t on every token.

Logged by begin_step as ais/*: reliability (R), kl (K), severity (S), variance_amp (V), variance_penalty (P),
cv (std/mean of the same weights as R: R = 1 / (1 + cv^2) exactly, so it is a view of R, not a fourth
diagnostic), alpha_batch (this batch's clip(S R P)), alpha (what the loss uses), rho_p50 / p95 / p99 / max
(of the uncapped rho) and rho_above_cap (fraction of rho > cap).

INTERPRETATION choices made here: before the first begin_step alpha = 0 (uncorrected), unless `alpha` is
forced; `level: sequence` computes R and cv over per-sequence weights exp(mean_t log rho_t) (for
when token-level ESS sits too close to 1), while K, V and the loss weights stay per token;
with train.old_policy = sampler pi_old is mu, rho = 1 and AIS is grpo. w_t is itself a (blended) TIS weight
built from pi_old / mu, so correction.mode tis / mis would correct every token twice (w_t min(rho, C));
config resolution refuses the combination (`mismatch_corrected` = "all", thinkrl/learner/correction.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import ClipConfig, clipped_loss, log_ratio, masked_mean, masked_quantile, reduce


@dataclass
class Config(ClipConfig):
    cap: float = 2.0
    """C: truncation of rho in the loss weight (1 - alpha) + alpha min(rho, C)."""
    kappa: float = 0.05
    """Scale of the severity map S = 1 - exp(-K / kappa), K the k3 estimate of KL(mu || pi_old)."""
    safe_cap: float = 10.0
    """rho is capped here for the diagnostics (R, K, V, cv) so one token cannot dominate them."""
    alpha: float | None = None
    """Force the mixing coefficient (0 = grpo, 1 = token TIS with cap); None = adaptive from the diagnostics."""
    ema: float = 0.0
    """Smoothing of alpha across steps: alpha = ema alpha_prev + (1 - ema) alpha_batch; 0 = off (0.9 suggested)."""
    level: Literal["token", "sequence"] = "token"
    """Weights of the reliability R (and cv): per token, or per sequence exp(mean_t log rho_t)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cap > 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")
        if self.kappa <= 0:
            raise ValueError(f"kappa must be > 0, got {self.kappa}")
        if self.safe_cap < 1:
            raise ValueError(f"safe_cap must be >= 1, got {self.safe_cap}")
        if self.alpha is not None and not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1] or None (adaptive), got {self.alpha}")
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema must be in [0, 1) (0 = off), got {self.ema}")


def _pop_var(x: Tensor) -> Tensor:
    """Population variance (divide by n) of a 1-D tensor."""
    return (x - x.mean()).square().mean()


def ais_diagnostics(rho: Tensor, adv: Tensor, mask: Tensor, cfg: Config) -> dict[str, Tensor]:
    """The three diagnostics, cv, alpha = clip(S R P, 0, 1) and the rho quantiles over mask == 1 tokens.

    rho (B, T) is pi_old / mu uncapped; the statistics cap it at cfg.safe_cap and run in float64. With no
    valid token the result is the no-correction point (R = 1, K = 0, V = 1, alpha = 0).
    """
    valid = mask.bool()
    raw = rho.detach().double()[valid]  # (N,)
    if raw.numel() == 0:
        zero, one = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
        names = ("kl", "severity", "cv", "alpha", "rho_p50", "rho_p95", "rho_p99", "rho_max", "rho_above_cap")
        return {"reliability": one, "variance_amp": one, "variance_penalty": one, **{k: zero for k in names}}
    r = raw.clamp(max=cfg.safe_cap)  # (N,)
    a = adv.detach().double()[valid]  # (N,)
    if cfg.level == "sequence":  # one weight per sequence: the geometric mean of its token ratios
        logr = torch.where(valid, rho.detach().double().clamp(min=1e-30).log(), 0.0)  # (B, T)
        n_tok = valid.sum(-1)  # (B,)
        w = (logr.sum(-1)[n_tok > 0] / n_tok[n_tok > 0]).exp().clamp(max=cfg.safe_cap)  # (B',)
    else:
        w = r
    reliability = w.sum().square() / (w.numel() * w.square().sum())  # ESS / N
    cv = _pop_var(w).sqrt() / w.mean()
    kl = (r - 1 - r.log()).mean()  # k3: >= 0 per token
    severity = 1 - torch.exp(-kl / cfg.kappa)
    var_a = _pop_var(a)
    # all advantages equal (e.g. all 0): the ratio is undefined; V = 1 means "no amplification", P = 1
    variance_amp = _pop_var(r * a) / var_a if var_a > 0 else torch.ones((), dtype=torch.float64)
    variance_penalty = 1 / variance_amp.clamp(min=1)
    q = {f"rho_{k}": masked_quantile(rho, valid, p).double() for k, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}
    return {
        "reliability": reliability,
        "kl": kl,
        "severity": severity,
        "variance_amp": variance_amp,
        "variance_penalty": variance_penalty,
        "cv": cv,
        "alpha": (severity * reliability * variance_penalty).clamp(0, 1),
        **q,
        "rho_max": raw.max(),
        "rho_above_cap": (raw > cfg.cap).double().mean(),
    }


def ais_weights(old_logp: Tensor, behav_logp: Tensor, alpha: float, cap: float) -> Tensor:
    """w = (1 - alpha) + alpha min(pi_old / mu, cap), detached.  # (B, T)"""
    rho = torch.exp(log_ratio(old_logp, behav_logp)).detach()  # (B, T)
    return (1.0 - alpha) + alpha * rho.clamp(max=cap)


@register("ais")
class AIS(Method[Config]):
    """GRPO weighted by (1 - alpha) + alpha min(pi_old/mu, 2); alpha per step from reliability, severity, variance."""

    recipe = {"rollout.precision": "fp8"}  # the paper's setting: an fp8 sampler against a higher-precision trainer
    acts_off_policy = True

    def __init__(self, **overrides) -> None:
        super().__init__(**overrides)
        self.alpha_state, self.started = 0.0, False  # alpha before any begin_step: uncorrected

    @property
    def mismatch_corrected(self) -> str:
        return "all"  # w_t already weights every token by pi_old / mu

    @property
    def alpha(self) -> float:
        """The mixing coefficient the loss uses now: the forced value, else the adaptive state."""
        return self.cfg.alpha if self.cfg.alpha is not None else self.alpha_state

    def begin_step(self, view) -> dict[str, Tensor]:
        c = self.cfg
        rho = torch.exp(log_ratio(view.old_logp, view.behav_logp))  # (B, T)
        diag = ais_diagnostics(rho, view.advantages, view.mask, c)
        if view.mask.any():  # an empty batch leaves alpha where it was
            batch_alpha = diag["alpha"].item()
            smooth = c.ema > 0 and self.started
            self.alpha_state = c.ema * self.alpha_state + (1 - c.ema) * batch_alpha if smooth else batch_alpha
            self.started = True
        metrics = {f"ais/{k}": v.float() for k, v in diag.items() if k != "alpha"}
        metrics["ais/alpha_batch"] = diag["alpha"].float()
        metrics["ais/alpha"] = torch.tensor(self.alpha)
        return metrics

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c = self.cfg
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, c)  # (B, T)
        w = ais_weights(batch.old_logp, batch.behav_logp, self.alpha, c.cap)  # (B, T); alpha = 0 gives exactly 1
        metrics["ais/weight_mean"] = masked_mean(w, batch.mask)
        return reduce(per_token * w, batch, c), metrics

    def state_dict(self) -> dict:
        return {"alpha": self.alpha_state, "started": self.started}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"alpha", "started"}:
            raise ValueError(f"ais state needs keys alpha, started; got {sorted(state)}")
        self.alpha_state, self.started = float(state["alpha"]), bool(state["started"])
