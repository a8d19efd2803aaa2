"""pi_old, the proximal policy: what the update phase needs to know about the policy before it changes.

With one update per rollout and a method that asks for nothing more, old_logp is the training forward's
own logp.detach() and this module does nothing. Otherwise one no-grad pass over the rollout batch, before
the first update, supplies what the method declares in `requires`, each computed chunk by chunk from the
next-token distributions so no (B, T, V) float32 tensor ever exists:

    old_logp        log pi_old(y_t)                                    (B, T)
    old_entropy     entropy of pi_old's next-token distribution        (B, T)
    topk_*          top-K ids and log-probs of the proposal            (B, T, K)
    token_js        JS divergence of each position's distribution to the mean distribution of the batch
                    (or of its own response): a second pass, as the mean needs the first   (B, T)

With train.old_policy=sampler (verl's "bypass mode") the sampler's own records stand in for pi_old:
behav_logp, and the top-K and entropy it recorded while sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl import distributed, sharding
from thinkrl.config import Config
from thinkrl.forward import visit_distributions
from thinkrl.learner.batching import RolloutBatch, micro_batches
from thinkrl.learner.logprobs import through_root
from thinkrl.methods import Method
from thinkrl.ops import js_divergence


@dataclass
class OldPolicy:
    logp: Tensor | None = None  # (B, T) None = use the training forward's logp.detach()
    entropy: Tensor | None = None  # (B, T)
    topk_ids: Tensor | None = None  # (B, T, K)
    topk_logp: Tensor | None = None  # (B, T, K)
    token_js: Tensor | None = None  # (B, T)


def needs_pass(method: Method, cfg: Config) -> bool:
    """Whether the update phase must run the no-grad pi_old pass first."""
    needs, tc = method.requires, cfg.train
    if tc.old_policy == "sampler":
        return "token_js" in needs
    multi_update = tc.mini_batches * tc.epochs > 1
    steps_first = type(method).begin_step is not Method.begin_step  # the view needs old_logp of the whole batch
    return multi_update or steps_first or bool(needs & {"old_entropy", "topk_ids", "topk_old_logp", "token_js"})


@torch.no_grad()
def old_policy(model, rb: RolloutBatch, method: Method, cfg: Config, pad_id: int) -> OldPolicy:
    """Everything the method requires of pi_old, for the whole rollout batch rb (thinkrl/learner/update.py)."""
    needs, tc, comp = method.requires, cfg.train, rb.comp
    if tc.old_policy == "sampler":
        out = OldPolicy(comp.behav_logp, comp.entropy, comp.topk_ids, comp.topk_logp)
        if "token_js" in needs:
            out.token_js = token_js(model, rb, method, cfg, pad_id)
        return out
    if not needs_pass(method, cfg):
        return OldPolicy()
    K = method.topk_width if needs & {"topk_ids", "topk_old_logp"} else 0
    out = policy_pass(model, rb, cfg, pad_id, "old_entropy" in needs, K)
    if "token_js" in needs:
        out.token_js = token_js(model, rb, method, cfg, pad_id)
    return out


@torch.no_grad()
def policy_pass(model, rb: RolloutBatch, cfg: Config, pad_id: int, entropy: bool = False, K: int = 0) -> OldPolicy:
    """log-probs of the rollout's tokens under `model` (B, T), optionally entropy and the top-K (B, T, K)."""
    comp = rb.comp
    B, T = comp.tokens.shape
    out = OldPolicy(torch.zeros((B, T), device=comp.tokens.device))
    if entropy:
        out.entropy = torch.zeros((B, T), device=comp.tokens.device)
    if K:
        out.topk_ids = torch.zeros((B, T, K), dtype=torch.long, device=comp.tokens.device)
        out.topk_logp = torch.zeros((B, T, K), device=comp.tokens.device)

    def first(logp: Tensor, where: tuple[Tensor, Tensor], y: Tensor) -> None:
        out.logp[where] = logp.gather(-1, y[:, None]).squeeze(-1)
        if out.entropy is not None:
            out.entropy[where] = -(logp.exp() * logp).sum(-1)
        if K:
            top = logp.topk(K, dim=-1)
            out.topk_ids[where], out.topk_logp[where] = top.indices, top.values

    _each_chunk(model, rb, cfg, pad_id, first)
    return out


def _each_chunk(model, rb: RolloutBatch, cfg: Config, pad_id: int, fn) -> None:
    """fn(logp (n, V), (rows, cols) of those n positions in the (B, T) batch, their token ids (n,)).

    `model` is the trainer's root module (or a bare policy): each micro-batch runs inside its forward
    (logprobs.through_root). Under FSDP2 every forward is a round of collectives, so a rank with fewer
    micro-batches than another runs its last one again, its output unused, until the counts agree."""
    comp, tc = rb.comp, cfg.train
    chunks = micro_batches(
        torch.arange(comp.tokens.shape[0]), comp.lengths.cpu(), tc.micro_batch_size, rb.group_size, tc.micro_batch_tokens
    )
    passes = int(distributed.all_max(len(chunks))) if sharding.is_sharded(model) else len(chunks)
    for i in range(passes):
        rows = chunks[min(i, len(chunks) - 1)]
        T = int(comp.lengths[rows].max())
        tokens, mask = comp.tokens[rows, :T], comp.mask[rows, :T]
        r, c = mask.nonzero(as_tuple=True)  # row-major, the order visit_distributions uses
        r = rows.to(r.device)[r]
        prompts = [rb.prompt_ids[k] for k in rows.tolist()]

        def visit(logp: Tensor, start: int, r=r, c=c, again=i >= len(chunks)) -> None:
            if again:  # a repeated pass: it only keeps the collectives in step
                return
            sl = slice(start, start + logp.shape[0])
            fn(logp, (r[sl], c[sl]), comp.tokens[r[sl], c[sl]])

        temperature = cfg.rollout.temperature
        through_root(model, lambda policy: visit_distributions(policy, prompts, tokens, mask, pad_id, temperature, visit))  # noqa: B023


def token_js(model, rb: RolloutBatch, method: Method, cfg: Config, pad_id: int) -> Tensor:
    """(B, T) JS divergence of pi_old's distribution at each valid position to the mean distribution over
    the valid positions of the batch (method.js_reference == 'batch') or of the same response ('response')."""
    comp = rb.comp
    B, T = comp.tokens.shape
    per_response = method.js_reference == "response"
    sums: dict[str, Tensor] = {}

    def accumulate(logp: Tensor, where, y) -> None:
        p = logp.exp()  # (n, V)
        if "s" not in sums:
            sums["s"] = torch.zeros((B if per_response else 1, p.shape[-1]), device=p.device)
        sums["s"].index_add_(0, where[0] if per_response else torch.zeros_like(where[0]), p)

    _each_chunk(model, rb, cfg, pad_id, accumulate)
    counts = comp.mask.sum(-1, keepdim=True).float() if per_response else comp.mask.sum().reshape(1, 1).float()
    if not per_response:  # the batch's mean distribution is over every rank's positions, as in one process
        V = int(distributed.all_max(sums["s"].shape[-1] if "s" in sums else 0))
        if "s" not in sums:  # no valid position on this rank: it still adds its (zero) part
            sums["s"] = torch.zeros((1, V), device=comp.tokens.device)
        sums["s"], counts = distributed.all_sum_tensor(sums["s"]), distributed.all_sum_tensor(counts)
    mean = sums["s"] / counts.clamp(min=1)  # (B or 1, V)
    js = torch.zeros((B, T), device=comp.tokens.device)

    def score(logp: Tensor, where, y) -> None:
        js[where] = js_divergence(logp.exp(), mean[where[0]] if per_response else mean)

    _each_chunk(model, rb, cfg, pad_id, score)
    return js
