"""Per-token log-probs of given completions under a model: the trainer's forward.

`token_logprobs` returns log pi(y_t) (B, T) under softmax(logits / temperature), and on request the entropy
and the log-probs at given top-K ids. Two things keep it cheap: completions of one group share one prompt
forward (a differentiable KV cache), and the output head runs on generated positions only, in chunks
(thinkrl/learner/head.py), so no (B, T, V) float32 logits exist at once, forward or backward.
`PolicyLogProbs` wraps it as one module for Accelerate (DDP/FSDP see its forward).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from thinkrl.errors import UserError
from thinkrl.learner import attention, replay
from thinkrl.learner.head import FusedHead, head_logp, is_plain_head, tempered_logits
from thinkrl.models import cache_kwarg, forwards_replaced, left_pad

CHUNK_ELEMS = 2**25  # logits elements per chunk (128 MB in float32): bounds memory for any B, T, V


class LogProbs(NamedTuple):
    logp: Tensor  # (B, T) log pi(y_t), 0 at mask == 0; carries grad under autograd
    entropy: Tensor | None  # (B, T) detached entropy of pi's next-token distribution (when asked for)
    topk_logp: Tensor | None  # (B, T, K) log pi at the given top-K ids (when given)


def _body_and_head(model):
    """The transformer body (hidden states) and the output head of a (peft-wrapped) causal LM."""
    base = model.module if hasattr(model, "module") else model  # DDP wrapper
    base = base.get_base_model() if hasattr(base, "get_base_model") else base  # peft: LoRA layers stay active
    return base.get_decoder(), base.get_output_embeddings(), base.config


def _hidden(model, prompts: list[list[int]], completions: Tensor, mask: Tensor, pad_id: int, checkpoint: bool = False, keep=frozenset()):
    """Hidden states (N, H) that predict each generated token (mask == 1, row-major), the targets (N,),
    and the output head and config. With `checkpoint` (under autograd) the completion pass keeps only each
    decoder layer's input (and the results replay.py names; `keep`: linear shapes) and recomputes the layer
    in the backward."""
    from transformers import DynamicCache

    body, head, config = _body_and_head(model)
    # Completions of one group share their prompt: run each distinct prompt once, with grad, and let every
    # completion attend to its (differentiable) key/value cache. Identical values and gradients to packing
    # [prompt | completion] per row, at a fraction of the cost when G completions share a prompt.
    slot: dict[tuple[int, ...], int] = {}
    which = torch.tensor([slot.setdefault(tuple(p), len(slot)) for p in prompts], device=completions.device)  # (B,)
    p_ids, p_attn, p_pos = left_pad([list(p) for p in slot], pad_id, completions.device)  # (U, Lp)
    cache = DynamicCache()
    kv = {cache_kwarg(body): cache, "use_cache": True}
    h_prompt = body(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, **kv).last_hidden_state[:, -1]  # (U, H)
    for layer in cache.layers:
        if len(slot) < len(prompts):
            # index_select, not cache.batch_select_indices: the backward of advanced indexing with repeated
            # indices accumulates in a thread-dependent order on CPU, which made runs irreproducible
            layer.keys, layer.values = layer.keys.index_select(0, which), layer.values.index_select(0, which)
        # the completion pass reads the prompt's keys and values without appending its own: the same
        # concatenation a cache makes, but a layer replayed by checkpointing sees the same cache again
        layer.update = functools.partial(_read_only_update, layer)
    B, T = completions.shape
    attn = torch.cat([p_attn[which], torch.ones((B, T), dtype=torch.long, device=completions.device)], dim=1)  # (B, Lp + T)
    pos = p_pos[which, -1:] + 1 + torch.arange(T, device=completions.device)  # (B, T)
    replayed = checkpoint and torch.is_grad_enabled()
    kv |= attention.marks(config, not bool(p_attn.all()), T)  # causal without a mask where it can (attention.py)
    with _checkpointed(_decoder_layers(body, config), keep) if replayed else contextlib.nullcontext():
        h_comp = body(input_ids=completions, attention_mask=attn, position_ids=pos, **kv).last_hidden_state  # (B, T, H)
    # the state before each generated token predicts it: last prompt state, then completion states 0..T-2
    h = torch.cat([h_prompt.index_select(0, which)[:, None], h_comp[:, :-1]], dim=1)[mask]  # (N, H)
    return h, completions[mask], head, config


def _read_only_update(layer, keys: Tensor, values: Tensor, *_args, **_kwargs) -> tuple[Tensor, Tensor]:
    """A cache layer's update that returns [cached | new] keys and values without storing them."""
    return torch.cat([layer.keys, keys], dim=-2), torch.cat([layer.values, values], dim=-2)


def _decoder_layers(body, config) -> torch.nn.ModuleList:
    """The body's list of decoder layers (`layers` in Llama, Qwen and most models; else the module list
    with one entry per hidden layer)."""
    if isinstance(getattr(body, "layers", None), torch.nn.ModuleList):
        return body.layers
    for m in body.children():
        if isinstance(m, torch.nn.ModuleList) and len(m) == config.num_hidden_layers:
            return m
    raise UserError(
        f"cannot find the decoder layers of {type(body).__name__} to checkpoint; set train.gradient_checkpointing=false "
        "(and lower train.micro_batch_tokens if memory runs out)"
    )


def _checkpointed(layers: torch.nn.ModuleList, keep: frozenset = frozenset()):
    """A block inside which each decoder layer runs under torch.utils.checkpoint (non-reentrant): its
    activations are dropped after the forward and recomputed, by the same operations on the same inputs,
    in the backward, but for the long causal attention's output and the outputs of the linear layers whose
    (in, out) shapes `keep` names, which the forward keeps for the replay (replay.py). Memory per layer is its
    input and those results; values and gradients do not change."""
    from torch.utils.checkpoint import checkpoint

    context = functools.partial(replay.kept_in_replay, keep)

    def replayed(forward):
        return lambda *args, **kwargs: checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=False, context_fn=context)

    return forwards_replaced({layer: replayed(layer.forward) for layer in layers})


def activation_bytes(config, tokens: int, element_size: int = 4) -> int:
    """Rough size of what the backward keeps of `tokens` completion tokens without checkpointing: per layer
    and token about 10 hidden-size and 5 intermediate-size vectors (norms, q/k/v, attention output,
    residuals, gate/up and their products, LoRA's low-rank activations)."""
    H = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or 4 * H
    return tokens * config.num_hidden_layers * (10 * H + 5 * inner) * element_size


def replay_bytes(config, tokens: int, element_size: int = 4) -> int:
    """What a checkpointed pass keeps before any linear outputs: per layer and token its input and the
    attention's output and log-sum-exp, plus one layer's activations while its replay runs."""
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
) -> LogProbs:
    """log pi(y_t) (B, T) of `completions` after their `prompts`, under softmax(logits / temperature); with
    `entropy` its entropy (B, T), with topk_ids (B, T, K) log pi at those ids (B, T, K). The head runs only on
    generated positions (mask == 1), in chunks; under autograd each chunk is checkpointed or uses FusedHead.
    `checkpoint` recomputes each decoder layer in the backward (less memory, same values), but for the outputs
    of linear layers of the (in_features, out_features) shapes in `keep` (replay.py)."""
    h, y, head, config = _hidden(model, prompts, completions, mask, pad_id, checkpoint, keep)
    ids = topk_ids[mask] if topk_ids is not None else None  # (N, K)
    rows = max(1, CHUNK_ELEMS // head.weight.shape[0])
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    fused = ids is None and is_plain_head(head, config)
    for s in range(0, h.shape[0], rows):
        if fused:  # one chunk: keep p for the backward; several: recompute it, as checkpointing would
            lp, ent = FusedHead.apply(h[s : s + rows], head.weight, y[s : s + rows], temperature, h.shape[0] <= rows, head)
            parts.append((lp, ent, lp.new_zeros((len(lp), 0))))
            continue
        args = (head, config, h[s : s + rows], y[s : s + rows], temperature, entropy, ids[s : s + rows] if ids is not None else None)
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


@torch.no_grad()
def visit_distributions(
    model, prompts: list[list[int]], completions: Tensor, mask: Tensor, pad_id: int, temperature: float, visit, raw: bool = False
) -> None:
    """Call visit(logp (n, V), start) for consecutive chunks of the N generated positions (row-major over
    mask == 1), logp being the tempered next-token log-distribution (raw: the float32 logits themselves):
    for statistics that need the whole vocabulary (top-K, JS divergence) without ever holding (B, T, V) of it."""
    h, _, head, config = _hidden(model, prompts, completions, mask, pad_id)
    rows = max(1, CHUNK_ELEMS // head.weight.shape[0])
    for s in range(0, h.shape[0], rows):
        logits = tempered_logits(head, config, h[s : s + rows], 1.0 if raw else temperature)  # (n, V)
        visit(logits if raw else torch.log_softmax(logits, -1), s)


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
    transformers / peft model itself (sampling, checkpoints, export)."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy = policy

    def forward(
        self, prompts, completions, mask, pad_id: int, temperature: float, entropy=False, topk_ids=None, checkpoint=False, keep=frozenset()
    ) -> LogProbs:
        return token_logprobs(self.policy, prompts, completions, mask, pad_id, temperature, entropy, topk_ids, checkpoint, keep)
