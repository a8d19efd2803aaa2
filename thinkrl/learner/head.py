"""The output head on N hidden states: log pi(y), entropy and top-K log-probs of softmax(h W^T / T).

Two implementations of the same numbers. `FusedHead` is the common case (a bias-free linear head without
logit scaling) with the backward written out, which spends fewer full-vocabulary passes than autograd
through logsumexp + gather; `head_logp` is plain autograd for everything else (top-K, scaled or softcapped
logits). Callers (thinkrl/learner/logprobs.py) cut N into chunks so no (N, V) float32 tensor gets large.

Entropy is detached unless `entropy_grad` asks for its gradient (an entropy term in a loss): with z the raw
logits, p = softmax(z / T) and H = -sum p log p, dH/dz_j = -(1/T) p_j (log p_j + H). Off, it costs nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.forward import tempered_logits


def head_logp(
    head,
    config,
    hidden: Tensor,
    targets: Tensor,
    temperature: float,
    want_entropy: bool,
    topk_ids: Tensor | None,
    entropy_grad: bool = False,
):
    """log-prob of targets (N,), entropy (N,) (detached unless entropy_grad), and log-probs at topk_ids (N, K)
    for N hidden states. Plain autograd; the common case (no top-K, no logit scaling) goes through FusedHead."""
    logits = tempered_logits(head, config, hidden, temperature)  # (N, V)
    logz = torch.logsumexp(logits, -1)  # (N,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz  # (N,)
    topk = logits.gather(-1, topk_ids) - logz[:, None] if topk_ids is not None else logp.new_zeros((len(logp), 0))  # (N, K)
    if not want_entropy:
        return logp, torch.zeros_like(logp.detach()), topk
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):  # detached: autograd keeps no (N, V) for it
        ent = logz - (torch.softmax(logits, -1) * logits).sum(-1)  # (N,)  H = log Z - E_p[logit]
    return logp, ent, topk


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """sum(a * b, -1) without an (N, V) temporary.  (N, V), (N, V) -> (N,)"""
    return (a[:, None, :] @ b[:, :, None]).squeeze(-1).squeeze(-1)


class FusedHead(torch.autograd.Function):
    """log pi(y) and the entropy of softmax(h W^T / T) over N positions, with the backward written out:
    d log pi(y) / d logits = (onehot(y) - p) / T. Autograd through logsumexp + gather spends about twice as
    many full-vocabulary passes (the profile's largest non-matmul cost in a training step). The entropy is
    non-differentiable unless `entropy_grad`; then d H / d logits = -p (log p + H) / T joins the backward.

    A frozen head (LoRA) needs only the gradient reaching h, and for one position that is the loss's scalar
    dL/dlog pi(y) times the (H,) vector (onehot(y) - p) W / T, known as soon as p is. The forward computes that
    (N, H) product while p exists and saves it alone (with entropy_grad, also -(p (log p + H)) W / T); the
    backward scales its rows. p (N, V) is then neither kept nor recomputed, which spares one full-vocabulary
    matmul per chunk when a pass is cut into chunks
    (the head alone on 2,048 positions in 682-row chunks, SmolLM2's 49,152 x 576, 2 cores: 2.9 s -> 1.9 s
    forward and backward; whole 16 x 1,024-token steps did not resolve it from run-to-run drift).
    A head that trains needs p itself for its weight gradient: keep=True saves p; keep=False saves only h and
    log Z and recomputes p, which bounds memory when a micro-batch is cut into several chunks. The logits
    come from `head` (a bias-free Linear over `weight`) when given: in the update phase its forward runs
    through the packed frozen weight (thinkrl/accel/packed.py)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, keep: bool, head=None, entropy_grad=False):
        logits = _logits(head, hidden, weight)  # (N, V)
        if temperature != 1.0:
            logits.div_(temperature)
        logz = torch.logsumexp(logits, -1)  # (N,)
        logp_all = logits.sub_(logz[:, None])  # (N, V) log p, in place
        p = logp_all.exp()  # (N, V)
        entropy = -_row_dot(p, logp_all)  # (N,)
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # (N,)
        ctx.temperature, ctx.keep, ctx.head, ctx.entropy_grad = temperature, keep, head, entropy_grad
        ctx.set_materialize_grads(False)  # an output the loss leaves unused sends None, not zeros to multiply
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        ctx.frozen = not ctx.needs_input_grad[1]
        if ctx.frozen:  # d log pi(y) / d h = (onehot(y) - p) W / T, per position
            dh = dh_entropy = None
            if ctx.needs_input_grad[0] and entropy_grad:  # d H / d h = -(p (log p + H)) W / T, in log p's buffer
                logp_all.add_(entropy[:, None]).mul_(p).neg_()  # (N, V)
                dh_entropy = (logp_all.to(hidden.dtype) @ weight).div_(temperature)  # (N, H)
            del logits, logp_all  # the (N, V) buffer they share, before p's product allocates
            if ctx.needs_input_grad[0]:
                p.neg_().scatter_add_(-1, targets[:, None], torch.ones_like(p[:, :1]))  # (N, V) onehot(y) - p
                dh = (p.to(hidden.dtype) @ weight).div_(temperature)  # (N, H)
            ctx.save_for_backward(dh, dh_entropy)
            return logp, entropy
        ctx.save_for_backward(hidden, weight, targets, p if keep else logz, entropy if entropy_grad else None)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):
        if not ctx.entropy_grad:
            grad_entropy = None
        if ctx.frozen:
            dh, dh_entropy = ctx.saved_tensors
            grad_h = dh * grad_logp.to(dh.dtype)[:, None] if dh is not None and grad_logp is not None else None  # (N, H)
            if dh_entropy is not None and grad_entropy is not None:
                part = dh_entropy * grad_entropy.to(dh_entropy.dtype)[:, None]  # (N, H)
                grad_h = part if grad_h is None else grad_h.add_(part)
            return grad_h, None, None, None, None, None, None
        hidden, weight, targets, saved, entropy = ctx.saved_tensors
        T = ctx.temperature
        if ctx.keep:
            p = saved
        else:  # recompute p from h and log Z
            p = _logits(ctx.head, hidden, weight)
            if T != 1.0:
                p.div_(T)
            p = p.sub_(saved[:, None]).exp_()
        g = grad_logp.float() / T if grad_logp is not None else p.new_zeros(len(p))  # (N,)
        if grad_entropy is None:
            grad_logits = p * -g[:, None]  # (N, V)
        else:  # -p (g + gH (log p + H)); xlogy: p log p is 0 where p underflowed (log p alone would be -inf)
            gh = grad_entropy.float() / T  # (N,)
            grad_logits = torch.xlogy(p, p).mul_(-gh[:, None])  # (N, V)
            grad_logits.addcmul_(p, -(g + gh * entropy)[:, None])
        grad_logits.scatter_add_(-1, targets[:, None], g[:, None])  # + onehot(y) g
        grad_logits = grad_logits.to(hidden.dtype)
        grad_h = grad_logits @ weight if ctx.needs_input_grad[0] else None  # (N, H)
        grad_w = grad_logits.t() @ hidden if ctx.needs_input_grad[1] else None  # (V, H)
        return grad_h, grad_w, None, None, None, None, None


def _logits(head, hidden: Tensor, weight: Tensor) -> Tensor:
    """float32 logits (N, V) of N hidden states."""
    return (head(hidden) if head is not None else hidden @ weight.t()).float()


def is_plain_head(head, config) -> bool:
    """A bias-free linear head without logit scaling or softcapping: what FusedHead computes."""
    scaled = getattr(config, "logit_scale", None) or getattr(config, "final_logit_softcapping", None)
    return isinstance(head, torch.nn.Linear) and head.bias is None and not scaled
