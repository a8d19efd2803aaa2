"""STARE: Surprisal-guided Token-level Advantage Reweighting for policy entropy stability.

Paper: "STARE: Surprisal-Guided Token-Level Advantage Reweighting for Policy Entropy Stability", arXiv 2606.19236.
Reference code: hp-luo/STARE (`STAREController`, `compute_stare_token_weights`, `compute_policy_loss_stare`).
Confidence: EXACT-CODE (docs/methods.md, stare).

To first order a token's entropy change is its advantage times an entropy-sensitivity term: positive-advantage
high-surprisal tokens push the policy entropy up. While the batch entropy is below a target, STARE multiplies
the surrogate of the most surprising positive-advantage tokens by W > 1 (and, in variant C2, of the most
surprising negative-advantage tokens by M < 1); otherwise it is the plain host loss. Objective (minimised):

    controller, once per step (begin_step) over the whole rollout batch, before the first update:
      H      = token-mean entropy of pi_old over valid tokens
      gate   = 1[H < target_entropy]
      if adaptive: sigma = sign(target_entropy - H); W = clip(W + alpha sigma, 1, w_max);
                   M = clip(M - alpha sigma, m_min, 1)                  (runs whether or not the gate is on)
    loss, per call:
      r      = pi_theta(y_t) / pi_old(y_t)
      l_t    = max(-r A, -clip(r, 1 - clip_low, 1 + clip_high) A);  l_t = min(l_t, -c A) where A < 0   (dual clip)
      s_t    = -log pi_theta(y_t)  (detached surprisal)
      T+     = {valid, A > 0};  k+ = min(|T+|, max(1, ceil(top_ratio |T+|)));  L+ = the k+ highest s_t in T+
      T-, L- likewise for A < 0 (variant c2 only)
      w_t    = W on L+, M on L- (c2), 1 elsewhere, when the gate is on; 1 everywhere when it is off
      loss   = token-mean of w_t l_t                                    (times TIS weights, if any)

Since w > 0 no token's gradient changes sign: the effective advantage is w_t A. Defaults (README and the 7B
run script): variant o1, top_ratio 0.1, W 1.1, M 0.9, target 0.3, adaptive off (alpha 0.01, w_max 1.5,
m_min 0.5 when on); host clip 0.2 / 0.28 with dual clip c = 10, token-mean, GRPO advantages, no KL.
Relative to grpo: DAPO's clip-higher, dual clip 10, token-mean, and the gated surprisal reweighting.

Differences from the reference code (INTERPRETATION where they matter):
- Top-P selection runs over the batch this loss is called with. The reference selects within each
  micro-batch; here `batch_statistics` makes the trainer pass the whole mini-batch in one call, so the
  selection does not depend on train.micro_batch_size; with several processes it ranks every rank's part of the
  mini-batch (TokenBatch.gather), and begin_step's entropy is the global batch's.
- Ties in surprisal are broken deterministically: a stable sort keeps the earlier token in row-major order
  (lower sequence index, then lower position). The reference uses torch.topk, whose tie order is unspecified.
- k+ = ceil(top_ratio n) is computed as ceil(top_ratio n - 1e-6) so that float error cannot add a token
  (0.1 * 30 = 3.0000000000000004); the reference uses int(top_ratio n + 0.999999), the same rule.
- Initial state: the gate is off until the first begin_step (the reference starts with it on, but its trainer
  always updates the controller first). So `loss` without a begin_step is the vanilla loss: on-policy it is
  REINFORCE. `reinforce_on_policy` is still False because with the gate on the tokens are reweighted by design.
- A step whose batch has no valid token leaves the controller unchanged (the reference skips a non-finite
  entropy the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.methods import Method, register
from thinkrl.methods._common import Aggregation, ClipConfig, clipped_loss, log_ratio, masked_mean, reduce


@dataclass
class Config(ClipConfig):
    variant: Literal["o1", "c2"] = "o1"
    """o1: amplify the top positive-advantage tokens by W only; c2: also damp the top negative ones by M."""
    top_ratio: float = 0.1
    """P: fraction of the A > 0 (and, in c2, A < 0) tokens reweighted, the most surprising ones, at least 1."""
    w: float = 1.1
    """W >= 1: weight of the selected positive-advantage tokens (the paper uses 1.05 for 14B/32B models)."""
    m: float = 0.9
    """M in (0, 1]: weight of the selected negative-advantage tokens (variant c2 only)."""
    target_entropy: float = 0.3
    """Gate: reweight only while the step's token-mean entropy of pi_old is below this (nats)."""
    adaptive: bool = False
    """Move W and M by alpha each step toward more (entropy below target) or less (above) reweighting."""
    alpha: float = 0.01
    """Step size of the adaptive W / M schedule."""
    w_max: float = 1.5
    """Upper bound of the adaptive W."""
    m_min: float = 0.5
    """Lower bound of the adaptive M."""
    clip_high: float = 0.28
    dual_clip: float = 10.0
    """Dual-clip ratio c > 1 for negative advantages (the paper's run uses 10); 0 = off."""
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.top_ratio <= 1:
            raise ValueError(f"top_ratio must be in (0, 1], got {self.top_ratio}")
        if self.w < 1:
            raise ValueError(f"w must be >= 1 (it amplifies), got {self.w}")
        if not 0 < self.m <= 1:
            raise ValueError(f"m must be in (0, 1] (it damps), got {self.m}")
        if self.target_entropy < 0:
            raise ValueError(f"target_entropy must be >= 0 (nats), got {self.target_entropy}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.adaptive and not 1 <= self.w <= self.w_max:
            raise ValueError(f"w must be in [1, w_max={self.w_max}] when adaptive, got {self.w}")
        if self.adaptive and not 0 < self.m_min <= self.m:
            raise ValueError(f"m_min must be in (0, m={self.m}] when adaptive, got {self.m_min}")


def top_surprisal(surprisal: Tensor, candidates: Tensor, top_ratio: float, gather=None) -> Tensor:
    """The k = min(n, max(1, ceil(top_ratio n))) candidates of highest surprisal, n = number of candidates.  # (B, T) bool

    Ties keep the earlier token in row-major order (stable sort), so the selection is deterministic. `gather`
    (TokenBatch.gather) ranks the candidates of every process holding part of the batch, in rank order (the
    row-major order of the whole batch).
    """
    flat = candidates.reshape(-1)  # (B*T,)
    where = flat.nonzero().squeeze(-1)  # (n,) row-major positions of this call's candidates
    pooled, start = (gather or (lambda x: (x, 0)))(surprisal.reshape(-1)[where])  # (N,)
    chosen = torch.zeros_like(flat)
    n = pooled.numel()
    if n == 0:
        return chosen.view_as(candidates)
    k = min(n, max(1, math.ceil(top_ratio * n - 1e-6)))  # - 1e-6: 0.1 * 30 must give 3, not 4
    top = pooled.argsort(descending=True, stable=True)[:k]  # (k,) indices into the pooled candidates
    mine = top[(top >= start) & (top < start + where.numel())] - start  # those of this call
    chosen[where[mine]] = True
    return chosen.view_as(candidates)


def stare_weights(
    logp: Tensor, adv: Tensor, mask: Tensor, top_ratio: float, w: float, m: float | None, gather=None
) -> tuple[Tensor, Tensor]:
    """Token weights omega (W on the top positive-advantage surprisals, M on the negative ones when `m` is
    not None, else 1) and the mask of reweighted tokens.  # (B, T), (B, T)"""
    surprisal = -logp.detach()  # (B, T) it only ranks tokens: no gradient through the selection
    up = top_surprisal(surprisal, mask & (adv > 0), top_ratio, gather)  # (B, T) L+
    omega = torch.where(up, w, 1.0).to(logp.dtype)  # (B, T)
    if m is None:
        return omega, up
    down = top_surprisal(surprisal, mask & (adv < 0), top_ratio, gather)  # (B, T) L-
    return torch.where(down, m, omega).to(logp.dtype), up | down


@register("stare")
class STARE(Method[Config]):
    """Clip-higher + dual clip; while batch entropy < target, top-10% surprisal A>0 tokens get weight 1.1."""

    recipe = {
        "method.target_entropy": 1.5,
        "rollout.dynamic_sampling": True,
    }  # the gate must open on this small model's entropy scale; DAPO's dynamic sampling

    reinforce_on_policy = False  # with the gate on, tokens are reweighted on-policy by design
    batch_statistics = True  # the top-P surprisal selection is over the whole batch the loss sees

    def __init__(self, **overrides) -> None:
        super().__init__(**overrides)
        # controller state: the gate starts off, so a loss with no begin_step is the vanilla loss
        self.gate, self.w, self.m, self.entropy = False, self.cfg.w, self.cfg.m, float("nan")

    @property
    def requires(self) -> set[str]:
        return {"old_entropy"}

    def begin_step(self, view) -> dict[str, Tensor]:
        c = self.cfg
        if view.old_entropy is None:
            raise ValueError("stare needs view.old_entropy (listed in method.requires)")
        if view.mask.any():  # an empty batch leaves the controller where it was
            self.entropy = masked_mean(view.old_entropy, view.mask).item()
            self.gate = self.entropy < c.target_entropy
            if c.adaptive:
                sigma = (self.entropy < c.target_entropy) - (self.entropy > c.target_entropy)  # sign(target - H)
                self.w = min(max(self.w + c.alpha * sigma, 1.0), c.w_max)
                self.m = min(max(self.m - c.alpha * sigma, c.m_min), 1.0)
        metrics = {"stare/gate": float(self.gate), "stare/W": self.w, "stare/M": self.m}
        if math.isfinite(self.entropy):
            metrics["stare/entropy"] = self.entropy
        return {k: torch.tensor(v) for k, v in metrics.items()}

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        c, mask = self.cfg, batch.mask
        ratio = log_ratio(batch.logp, batch.old_logp).exp()  # (B, T)
        per_token, _, metrics = clipped_loss(ratio, batch, c)  # (B, T)
        if self.gate:
            m = self.m if c.variant == "c2" else None
            omega, chosen = stare_weights(batch.logp, batch.advantages, mask, c.top_ratio, self.w, m, batch.gather)  # (B, T)
            per_token = per_token * omega  # (B, T)
        else:  # gate off: leave the vanilla loss untouched, bit for bit
            omega, chosen = torch.ones_like(per_token.detach()), torch.zeros_like(mask)
        metrics["stare/reweighted_frac"] = masked_mean(chosen, mask)
        metrics["stare/omega_mean"] = masked_mean(omega, mask)
        return reduce(per_token, batch, c), metrics

    def state_dict(self) -> dict:
        return {"gate": self.gate, "w": self.w, "m": self.m, "entropy": self.entropy}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"gate", "w", "m", "entropy"}:
            raise ValueError(f"stare state needs keys gate, w, m, entropy; got {sorted(state)}")
        self.gate, self.w, self.m, self.entropy = bool(state["gate"]), float(state["w"]), float(state["m"]), float(state["entropy"])
