"""What the lean decoder's loop (lean_decoder.py) reads of a model: which families it covers, and each
layer's weights, norms, attention scale, soft-cap and window, so that the loop stays one path for all.

The families differ in a few places, each read here from the model's own modules and config:
- norms: Llama, Qwen, Mistral and Phi-3 norm each sublayer's input; Olmo-2 norms each sublayer's output
  instead (post-norms); Gemma-2 and Gemma-3 do both (four norms a layer), with RMSNorm weights w applied
  as 1 + w. Qwen3 and Gemma-3 norm each query and key head (q_norm, k_norm), Olmo-2 the whole q and k.
- attention: a sliding window (Mistral, Phi-3, Qwen2/Qwen3 with use_sliding_window, Gemma's sliding
  layers): a token attends to itself and the window - 1 positions before it (transformers'
  kv > q - window); Gemma's query_pre_attn_scalar scale and Gemma-2's logit soft-capping; Gemma-3's
  rotary tables per layer type (a local base on sliding layers).
- the MLP's activation (silu, Gemma's tanh gelu) and Gemma-2's final logit soft-capping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

SUPPORTED = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Olmo2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma2ForCausalLM",
)
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}
LAYER_TYPES = ("full_attention", "sliding_attention")
DYNAMIC_ROPE = ("dynamic", "longrope")  # tables that change with the sequence's length: not one per position


def _sliding_window(c) -> int | None:
    """The window a config's attention slides over: Qwen2 and Qwen3 switch theirs on with use_sliding_window,
    the others' applies whenever set."""
    return getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", True) else None


def _activation(c) -> str | None:
    return getattr(c, "hidden_activation", None) or getattr(c, "hidden_act", None)  # Gemma names it hidden_activation


def _rope_params(c) -> list[dict]:
    """The config's rope parameters, one dict per layer type (Gemma-3) or a single one."""
    p = getattr(c, "rope_parameters", None) or {}
    return [v for v in p.values() if isinstance(v, dict)] or [p]


def _dynamic_rope(c) -> str | None:
    return next((t for p in _rope_params(c) if (t := p.get("rope_type", "default")) in DYNAMIC_ROPE), None)


def _partial_rotary(c) -> float:
    return min([p.get("partial_rotary_factor", 1.0) for p in _rope_params(c)] + [getattr(c, "partial_rotary_factor", 1.0)])


# what the fused loop assumes of a config beyond its architecture, one row each: (what a refusal says of the
# value, how to read it, the values the loop runs)
ASSUMED = (
    ("activation {} (it runs " + " or ".join(ACTIVATIONS) + ")", _activation, tuple(ACTIVATIONS)),
    ("mlp_bias={} (it runs MLPs without biases)", lambda c: bool(getattr(c, "mlp_bias", False)), (False,)),
    ("pretraining_tp={} (it runs 1)", lambda c: getattr(c, "pretraining_tp", None) or 1, (1,)),
    ("partial_rotary_factor={} (it rotates whole heads)", _partial_rotary, (1.0,)),
    ("rope_type {} (its tables depend on the sequence length; it runs fixed ones)", _dynamic_rope, (None,)),
    ("use_bidirectional_attention={} (it runs causal attention)", lambda c: bool(getattr(c, "use_bidirectional_attention", 0)), (False,)),
    (
        "layer type {} (it runs " + " and ".join(LAYER_TYPES) + ")",
        lambda c: next((t for t in getattr(c, "layer_types", None) or () if t not in LAYER_TYPES), None),
        (None,),
    ),
)


def why_not(model) -> str | None:
    """Every condition of the fused loop `model` fails, joined; None when it runs it."""
    name = type(model).__name__
    why = [] if name in SUPPORTED else [f"{name} is not in the lean decoder (it covers {', '.join(SUPPORTED)})"]
    why += [say.format(value) for say, read, runs in ASSUMED if (value := read(model.config)) not in runs]
    if any(p.requires_grad for p in model.parameters()):  # _fuse would rewire the trainee's weights
        why.append("it samples with the trained policy itself, not a frozen copy (full fine-tuning, rollout.precision=same)")
    return "; ".join(why) or None


def _fuse(modules, name: str = "weight") -> Tensor | None:
    """One (out_1 + out_2 + ..., in) weight (or bias) whose row blocks become the modules' own (views of
    it), so writing module.weight in place (the sampler's refresh does) updates the fused matrix too, and
    no second copy of the weights is held. A single module (Phi-3's qkv_proj, gate_up_proj) is used as is."""
    if getattr(modules[0], name) is None:
        return None
    if len(modules) == 1:
        return getattr(modules[0], name).detach()
    fused = torch.cat([getattr(m, name).detach() for m in modules])
    start = 0
    for m in modules:
        rows = getattr(m, name).shape[0]
        setattr(m, name, torch.nn.Parameter(fused[start : start + rows], requires_grad=False))
        start += rows
    return fused


class Layer(NamedTuple):
    """One decoder layer's weights; the fused matrices are views shared with the model's modules (_fuse).
    A norm that is None is not applied: Olmo-2 has no pre-norms, Llama-shaped layers no post-norms."""

    norm1: Tensor | None  # before attention
    w_qkv: Tensor
    b_qkv: Tensor | None
    w_o: Tensor
    b_o: Tensor | None
    norm2: Tensor | None  # before the MLP
    w_gate_up: Tensor
    w_down: Tensor
    qk_norm: tuple[Tensor, Tensor] | None  # q and k RMSNorm weights: per head (D,) or over all heads (Hq D,), (Hk D,)
    post_attn: Tensor | None  # on the attention output, before the residual add
    post_mlp: Tensor | None  # on the MLP output, before the residual add


def read_layer(layer) -> Layer:
    a, m = layer.self_attn, layer.mlp
    qkv = [a.qkv_proj] if hasattr(a, "qkv_proj") else [a.q_proj, a.k_proj, a.v_proj]
    gate_up = [m.gate_up_proj] if hasattr(m, "gate_up_proj") else [m.gate_proj, m.up_proj]
    post = hasattr(layer, "post_feedforward_layernorm")  # Olmo-2, Gemma: post_attention_layernorm is a post-norm
    weight = lambda name: getattr(getattr(layer, name, None), "weight", None)  # noqa: E731
    return Layer(
        weight("input_layernorm"),
        _fuse(qkv),
        _fuse(qkv, "bias"),
        a.o_proj.weight,
        a.o_proj.bias,
        weight("pre_feedforward_layernorm" if post else "post_attention_layernorm"),
        _fuse(gate_up),
        m.down_proj.weight,
        (a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else None,
        weight("post_attention_layernorm") if post else None,
        weight("post_feedforward_layernorm"),
    )


def _rms(x: Tensor, weight: Tensor, eps: float, after: bool, offset: float) -> Tensor:
    """RMSNorm as the family's transformers code computes it: float32 statistics; weight (+ offset: Gemma's
    1 + w) applied after casting back to x's dtype (Llama) or before (Olmo-2, Gemma). In float32 as torch's one
    rms_norm call (the same steps; bit-equal in a check here) instead of six."""
    if offset:
        weight = weight.float() + offset
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype) if after else (weight * h).to(x.dtype)


def window_mask(queries: Tensor, end: int, window: int | None) -> Tensor:
    """(len(queries), end) bool: which positions a query at each of `queries` (positions) attends to: the
    causal ones, and with a window the last `window` of them (itself included)."""
    keys = torch.arange(end, device=queries.device)[None]
    allowed = keys <= queries[:, None]
    return allowed if window is None else allowed & (keys > queries[:, None] - window)


def capped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, cap: float) -> Tensor:
    """Attention with Gemma-2's logit soft-capping, in transformers' eager order: scores * scale, then
    tanh(s / cap) * cap, then the mask, a float32 softmax and the values. q (..., Lq, D); k, v (..., Lk, D)
    with the same or broadcastable heads; mask bool, broadcastable to (..., Lq, Lk)."""
    s = torch.tanh(q @ k.transpose(-1, -2) * scale / cap) * cap  # (..., Lq, Lk)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v


@dataclass(frozen=True)
class Family:
    """What one model's loop computes beyond the Llama shape, read once from its modules and config."""

    norm: Callable[[Tensor, Tensor], Tensor]  # RMSNorm(x, weight) in the family's convention
    act: Callable[[Tensor], Tensor]  # the MLP's gate activation
    scale: float | None  # attention scale; None: 1 / sqrt(D)
    softcap: float | None  # attention logit soft-cap (Gemma-2)
    final_softcap: float | None  # output logit soft-cap (Gemma-2)
    windows: tuple[int | None, ...]  # per layer: the sliding window, None for full attention
    kinds: tuple[str | None, ...]  # per layer: the rotary table it takes (Gemma-3's layer type; else None)
    narrowest: int | None  # the smallest window, None when no layer has one

    @staticmethod
    def of(model) -> Family:
        c, name, n = model.config, type(model).__name__, len(model.model.layers)
        window, types = _sliding_window(c), getattr(c, "layer_types", None)
        windows = tuple(window if types is None or t == "sliding_attention" else None for t in types or [None] * n)
        per_type = hasattr(model.model.rotary_emb, "layer_types")  # Gemma-3: rotary_emb(x, positions, layer_type)
        scalar = getattr(c, "query_pre_attn_scalar", None)
        return Family(
            norm=partial(_rms, eps=c.rms_norm_eps, after=not name.startswith(("Olmo2", "Gemma")), offset=float(name.startswith("Gemma"))),
            act=ACTIVATIONS[_activation(c)],
            scale=scalar**-0.5 if scalar else None,
            softcap=getattr(c, "attn_logit_softcapping", None),
            final_softcap=getattr(c, "final_logit_softcapping", None),
            windows=windows,
            kinds=tuple(types) if per_type else (None,) * n,
            narrowest=min((w for w in windows if w is not None), default=None),
        )

    def tables(self, rotary, x: Tensor, positions: Tensor) -> dict[str | None, tuple[Tensor, Tensor]]:
        """The rotary tables (cos, sin), each (n, L, D), of every kind a layer takes."""
        return {k: rotary(x, positions) if k is None else rotary(x, positions, k) for k in set(self.kinds)}
