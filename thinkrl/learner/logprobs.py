"""Per-token log-probs of given completions under a model: the trainer's forward.

`token_logprobs` returns log pi(y_t) (B, T) under softmax(logits / temperature), and on request the entropy
and the log-probs at given top-K ids. Two things keep it cheap: completions of one group share one prompt
forward (a differentiable KV cache, thinkrl/forward.py), and the output head runs on generated positions
only, in chunks (thinkrl/learner/head.py), so no (B, T, V) float32 logits exist at once, forward or backward.
`PolicyLogProbs` wraps it as one module for Accelerate (DDP/FSDP see its forward), and every other pass over
the policy (pi_old, the reference) runs inside that forward too (`through_root`): under FSDP2 the root unit
gathers the embedding and head only when its own forward runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from thinkrl import forward, sharding
from thinkrl.learner.head import FusedHead, head_logp, is_plain_head


class LogProbs(NamedTuple):
    logp: Tensor  # (B, T) log pi(y_t), 0 at mask == 0; carries grad under autograd
    entropy: Tensor | None  # (B, T) entropy of pi's next-token distribution (when asked for); grad with entropy_grad
    topk_logp: Tensor | None  # (B, T, K) log pi at the given top-K ids (when given)


def activation_bytes(config, tokens: int, element_size: int = 4) -> int:
    """Rough size of what the backward keeps of `tokens` completion tokens without checkpointing: per layer
    and token about 10 hidden-size and 5 intermediate-size vectors (norms, q/k/v, attention output,
    residuals, gate/up and their products, LoRA's low-rank activations)."""
    H = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * H
    return tokens * config.num_hidden_layers * (10 * H + 5 * inner) * element_size


def recompute_bytes(config, tokens: int, element_size: int = 4) -> int:
    """What a checkpointed pass keeps before any linear outputs: per layer and token its input and the
    attention's output and log-sum-exp, plus one layer's activations while its recompute runs."""
    H, Hq = config.hidden_size, config.num_attention_heads
    D = getattr(config, "head_dim", None) or H // Hq
    kept = tokens * config.num_hidden_layers * (H + Hq * (D + 1)) * element_size
    return kept + activation_bytes(config, tokens, element_size) // config.num_hidden_layers


def token_logprobs(
    model,
    prompts: list[list[int]],
    completions: Tensor,
    mask: Tensor,
    pad_id: int,
    temperature: float,
    entropy: bool = False,
    topk_ids: Tensor | None = None,
    checkpoint: bool = False,
    keep: frozenset = frozenset(),
    entropy_grad: bool = False,
    packed: bool = False,
) -> LogProbs:
    """log pi(y_t) (B, T) of `completions` after their `prompts`, under softmax(logits / temperature); with
    `entropy` its entropy (B, T), detached unless `entropy_grad` (which implies `entropy`: an entropy term in a
    loss), with topk_ids (B, T, K) log pi at those ids (B, T, K). The head runs only on
    generated positions (mask == 1), in chunks; under autograd each chunk is checkpointed or uses FusedHead.
    `checkpoint` recomputes each decoder layer in the backward (less memory, same values), but for the outputs
    of linear layers of the (in_features, out_features) shapes in `keep` (thinkrl/accel/kept_outputs.py).
    `packed`: the completion pass without padding where the model allows it (forward.hidden_states)."""
    entropy = entropy or entropy_grad
    h, y, head, config = forward.hidden_states(model, prompts, completions, mask, pad_id, checkpoint, keep, packed)
    ids = topk_ids[mask] if topk_ids is not None else None  # (N, K)
    rows = max(1, forward.CHUNK_ELEMS // head.weight.shape[0])
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    fused = ids is None and is_plain_head(head, config)
    for s in range(0, h.shape[0], rows):
        if fused:  # one chunk: keep p for the backward; several: recompute it, as checkpointing would
            lp, ent = FusedHead.apply(h[s : s + rows], head.weight, y[s : s + rows], temperature, h.shape[0] <= rows, head, entropy_grad)
            parts.append((lp, ent, lp.new_zeros((len(lp), 0))))
            continue
        ids_s = ids[s : s + rows] if ids is not None else None
        args = (head, config, h[s : s + rows], y[s : s + rows], temperature, entropy, ids_s, entropy_grad)
        if torch.is_grad_enabled() and h.shape[0] > rows:
            from torch.utils.checkpoint import checkpoint as recompute

            parts.append(recompute(head_logp, *args, use_reentrant=False))
        else:
            parts.append(head_logp(*args))
    lp, ent, topk = (torch.cat(x) for x in zip(*parts)) if parts else (h.new_zeros(0), h.new_zeros(0), h.new_zeros((0, 0)))
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=h.device).masked_scatter(mask, lp)  # (B, T)
    ent = torch.zeros(mask.shape, dtype=torch.float32, device=h.device).masked_scatter(mask, ent) if entropy else None
    if topk_ids is None:
        return LogProbs(logp, ent, None)
    out = torch.zeros((*mask.shape, topk_ids.shape[-1]), dtype=torch.float32, device=h.device)  # (B, T, K)
    return LogProbs(logp, ent, out.masked_scatter(mask[..., None].expand_as(out), topk))


@contextlib.contextmanager
def dropout_off(model) -> Iterator[None]:
    """Dropout off in `model` for the block, train mode otherwise kept: every
    dropout module (LoRA's lora_dropout included) and every attention module with a functional
    `attention_dropout` (transformers applies it only when the module is training). The update phase runs all
    its passes in here so that pi_old, the reference and the training forward are one policy
    (thinkrl/learner/update.py)."""
    dropping = [
        m
        for m in model.modules()
        if m.training and (isinstance(m, torch.nn.modules.dropout._DropoutNd) or _positive(getattr(m, "attention_dropout", 0)))
    ]
    for m in dropping:
        m.training = False  # the flag alone: .eval() would recurse into children that are not dropout
    try:
        yield
    finally:
        for m in dropping:
            m.training = True


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


class PolicyLogProbs(torch.nn.Module):
    """The policy as one module whose forward is token_logprobs: what Accelerate wraps in DDP/FSDP/DeepSpeed.

    token_logprobs runs the decoder body and the output head as separate calls (shared prompt cache, head
    on generated positions only). A wrapper such as DDP prepares its gradient all-reduce in its own
    forward, so those calls must happen inside it; wrapping this module does that. `.policy` is the
    transformers / peft model itself (sampling, checkpoints, export). `run=fn` calls fn(policy) inside the
    forward instead: a no-grad pass of another shape (learner/old_policy.py) through the same root."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy = policy
        # the decoder layer classes: what Accelerate's FSDP wraps one by one (TRANSFORMER_BASED_WRAP)
        self._no_split_modules = getattr(policy, "_no_split_modules", None) or getattr(
            getattr(policy, "get_base_model", lambda: policy)(), "_no_split_modules", None
        )

    def forward(self, *args, run=None, **kwargs):
        """token_logprobs(policy, *args, **kwargs); with run=fn, fn(policy)."""
        return run(self.policy) if run is not None else token_logprobs(self.policy, *args, **kwargs)


def through_root(model, fn):
    """fn(policy) for a no-grad pass over the policy held by `model` (the Accelerate-wrapped PolicyLogProbs, or
    a bare policy). Under FSDP2 it runs inside the root's forward: the root unit unshards its own parameters
    (embedding, final norm, head) only in its forward hook, and a pass that calls the inner policy meets them
    as shards ("got mixed torch.Tensor and DTensor"). Otherwise it calls the policy directly: DDP's forward
    would broadcast buffers (a collective) on every call and prepares nothing a no-grad pass needs."""
    inner = getattr(model, "module", model)  # DDP keeps the module as .module; FSDP2 changes the class in place
    if not isinstance(inner, PolicyLogProbs):
        return fn(model)
    return model(run=fn) if sharding.is_sharded(model) else fn(inner.policy)
