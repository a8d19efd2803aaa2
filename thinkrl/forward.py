"""The forward over given completions after their prompts: the hidden state that predicts each generated
token, with one prompt forward per group (completions of a group attend to its differentiable key/value
cache). The trainer's log-probs (learner/logprobs.py) and the distributions a sampler records
(rollout/engines/hf.py, learner/old_policy.py) both run it. The probe, whose many passes are over short
completions of uneven length, asks for the packed form: a group's completions back to back without padding.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import Tensor

from thinkrl import accel
from thinkrl.errors import UserError
from thinkrl.models import cache_kwarg, forwards_replaced, left_pad

CHUNK_ELEMS = 2**25  # logits elements per chunk (128 MB in float32): bounds memory for any B, T, V


def tempered_logits(head, config, hidden: Tensor, temperature: float) -> Tensor:
    """Tempered float32 logits of N hidden states, with the model's own scaling/softcapping.  (N, H) -> (N, V)"""
    logits = head(hidden).float()  # (N, V)
    if getattr(config, "logit_scale", None):
        logits = logits * config.logit_scale
    if getattr(config, "final_logit_softcapping", None):
        cap = config.final_logit_softcapping
        logits = torch.tanh(logits / cap) * cap
    return logits / temperature


def body_and_head(model):
    """The transformer body (hidden states) and the output head of a (peft-wrapped) causal LM."""
    base = model.module if hasattr(model, "module") else model  # DDP wrapper
    base = base.get_base_model() if hasattr(base, "get_base_model") else base  # peft: LoRA layers stay active
    return base.get_decoder(), base.get_output_embeddings(), base.config


def hidden_states(
    model,
    prompts: list[list[int]],
    completions: Tensor,
    mask: Tensor,
    pad_id: int,
    checkpoint: bool = False,
    keep=frozenset(),
    packed: bool = False,
):
    """Hidden states (N, H) that predict each generated token (mask == 1, row-major), the targets (N,),
    and the output head and config. With `checkpoint` (under autograd) the completion pass keeps only each
    decoder layer's input (and the results thinkrl/accel keeps; `keep`: linear shapes) and recomputes the layer
    in the backward. With `packed` (where the model allows it: packable), each group's completions run back to
    back in one row, without the padding after each one's end (for short completions of uneven length)."""
    from transformers import DynamicCache

    body, head, config = body_and_head(model)
    # Completions of one group share their prompt: run each distinct prompt once, with grad, and let every
    # completion attend to its (differentiable) key/value cache. Identical values and gradients to packing
    # [prompt | completion] per row, at a fraction of the cost when G completions share a prompt.
    slot: dict[tuple[int, ...], int] = {}
    which = torch.tensor([slot.setdefault(tuple(p), len(slot)) for p in prompts], device=completions.device)  # (B,)
    p_ids, p_attn, p_pos = left_pad([list(p) for p in slot], pad_id, completions.device)  # (U, Lp)
    cache = DynamicCache()
    kv = {cache_kwarg(body): cache, "use_cache": True}
    h_prompt = body(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, **kv).last_hidden_state[:, -1]  # (U, H)
    pack = packed and packable(config)
    for layer in cache.layers:
        if len(slot) < len(prompts) and not pack:
            # index_select, not cache.batch_select_indices: the backward of advanced indexing with repeated
            # indices accumulates in a thread-dependent order on CPU, which made runs irreproducible
            layer.keys, layer.values = layer.keys.index_select(0, which), layer.values.index_select(0, which)
        # the completion pass reads the prompt's keys and values without appending its own: the same
        # concatenation a cache makes, but a layer replayed by checkpointing sees the same cache again
        layer.update = functools.partial(_read_only_update, layer)
    recomputed = checkpoint and torch.is_grad_enabled()
    if pack:
        with _checkpointed(_decoder_layers(body, config), keep) if recomputed else contextlib.nullcontext():
            return _packed_pass(body, kv, h_prompt, which, completions, mask, p_attn, p_pos, pad_id), completions[mask], head, config
    B, T = completions.shape
    attn = torch.cat([p_attn[which], torch.ones((B, T), dtype=torch.long, device=completions.device)], dim=1)  # (B, Lp + T)
    pos = p_pos[which, -1:] + 1 + torch.arange(T, device=completions.device)  # (B, T)
    kv |= accel.attention_marks(config, not bool(p_attn.all()), T)  # causal without a mask where it can
    with _checkpointed(_decoder_layers(body, config), keep) if recomputed else contextlib.nullcontext():
        h_comp = body(input_ids=completions, attention_mask=attn, position_ids=pos, **kv).last_hidden_state  # (B, T, H)
    # the state before each generated token predicts it: last prompt state, then completion states 0..T-2
    h = torch.cat([h_prompt.index_select(0, which)[:, None], h_comp[:, :-1]], dim=1)[mask]  # (N, H)
    return h, completions[mask], head, config


def packable(config) -> bool:
    """Whether the completion pass can run packed: every layer attends fully and causally through SDPA, which
    takes the block mask as given (Llama, Qwen2, Qwen3; thinkrl's SDPA variant is SDPA without its mark)."""
    from thinkrl.accel.causal_attention import NAME, full_attention

    return getattr(config, "_attn_implementation", None) in ("sdpa", NAME) and full_attention(config)


def _packed_pass(body, kv: dict, h_prompt: Tensor, which: Tensor, completions: Tensor, mask: Tensor, p_attn, p_pos, pad_id: int):
    """The completion pass with group u's completions back to back in row u, each cut after its last generated
    token; a block mask lets each attend to its prompt and causally to itself alone, and its positions count on
    from the prompt as in its own row. Same values as the padded pass up to summation order.  -> (N, H)"""
    B, T = completions.shape
    U, dev = p_attn.shape[0], completions.device
    ends = torch.where(mask.bool(), torch.arange(1, T + 1, device=dev), 0).amax(1).tolist()  # (B,) through the last generated token
    starts, fill = [0] * B, [0] * U
    for b, u in enumerate(which.tolist()):
        starts[b], fill[u] = fill[u], fill[u] + ends[b]
    S = max(1, max(fill))
    ids = torch.full((U, S), pad_id, dtype=completions.dtype, device=dev)
    offset = torch.zeros((U, S), dtype=torch.long, device=dev)  # position within its completion
    seg = torch.full((U, S), -1, dtype=torch.long, device=dev)  # which completion (-1: padding)
    for b, u in enumerate(which.tolist()):
        ids[u, starts[b] : starts[b] + ends[b]] = completions[b, : ends[b]]
        offset[u, starts[b] : starts[b] + ends[b]] = torch.arange(ends[b], device=dev)
        seg[u, starts[b] : starts[b] + ends[b]] = b
    own = (seg[:, :, None] == seg[:, None, :]) & (offset[:, None, :] <= offset[:, :, None]) & (seg[:, None, :] >= 0)  # (U, S, S)
    sees = torch.cat([p_attn.bool()[:, None, :].expand(U, S, -1), own], dim=-1)[:, None]  # (U, 1, S, Lp + S)
    h_comp = body(input_ids=ids, attention_mask=sees, position_ids=p_pos[:, -1:] + 1 + offset, **kv).last_hidden_state  # (U, S, H)
    # the state before token t of completion b predicts it: its prompt's last state for t = 0, else packed state t - 1
    t = torch.arange(T, device=dev)
    at = (which * S + torch.tensor(starts, device=dev))[:, None] + t - 1  # (B, T) into the packed states
    index = torch.where(t == 0, which[:, None], U + at.clamp(min=0, max=U * S - 1))  # (B, T) into [prompt states | packed]
    states = torch.cat([h_prompt, h_comp.reshape(U * S, -1)])  # (U + U * S, H)
    return states.index_select(0, index[mask.bool()])  # (N, H)


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
    in the backward, but for what the accel hook keeps for the recompute (the long causal attention's output,
    the outputs of the linear layers whose (in, out) shapes `keep` names). Memory per layer is its input and
    those results; values and gradients do not change."""
    from torch.utils.checkpoint import checkpoint

    extra = accel.checkpoint_kwargs(keep)

    def recomputed(forward):
        return lambda *args, **kwargs: checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=False, **extra)

    return forwards_replaced({layer: recomputed(layer.forward) for layer in layers})


@torch.no_grad()
def visit_distributions(
    model, prompts: list[list[int]], completions: Tensor, mask: Tensor, pad_id: int, temperature: float, visit, raw: bool = False
) -> None:
    """Call visit(logp (n, V), start) for consecutive chunks of the N generated positions (row-major over
    mask == 1), logp being the tempered next-token log-distribution (raw: the float32 logits themselves):
    for statistics that need the whole vocabulary (top-K, JS divergence) without ever holding (B, T, V) of it."""
    h, _, head, config = hidden_states(model, prompts, completions, mask, pad_id)
    rows = max(1, CHUNK_ELEMS // head.weight.shape[0])
    for s in range(0, h.shape[0], rows):
        logits = tempered_logits(head, config, h[s : s + rows], 1.0 if raw else temperature)  # (n, V)
        visit(logits if raw else torch.log_softmax(logits, -1), s)
