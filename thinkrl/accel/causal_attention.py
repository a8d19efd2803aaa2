"""Causal attention for the completion pass, so the kernel can skip the blocks a causal mask hides.

The completion pass (thinkrl/forward.py) attends from T completion queries to [prompt cache | completion]
keys, Lp + T of them. transformers hands SDPA an explicit mask for that shape (its `is_causal` aligns the
diagonal top-left, which is wrong when there are more keys than queries), and with a mask SDPA computes every
query-key block. Here, when no prompt of the pass is padded, the queries are preceded by Lp zero rows: query i
then sits at position Lp + i, top-left `is_causal` lets it see exactly the prompt and completion tokens 0..i,
and the kernel skips the masked blocks. The extra rows are dropped from the output (their gradient is zero).
The output and query gradient are identical to the bit, key and value gradients equal up to summation order.
Below MIN_COMPLETION positions the extra rows cost more than the skipped blocks save (docs/benchmarks.md).

A checkpointed layer keeps this attention's output and log-sum-exp for its recompute (kept_outputs.py)
instead of running the kernel again. The switch is an attention implementation registered with transformers
that behaves as "sdpa" unless the completion pass marks its call (`prompt_causal=True` in the forward's
kwargs); `prompt_causal_attention` selects it for the update phase and restores "sdpa" after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from thinkrl.accel import kept_outputs

NAME = "thinkrl_sdpa"
MIN_COMPLETION = 768  # completion positions (the pass's padded length) from which the causal form is used (below it, it measured slower)
_TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])
MODEL_TYPES = ("llama", "qwen2", "qwen3")  # decoder-only, one full causal attention per layer, kwargs reach attention


def _attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention-interface signature: (B, Hq, T, D) queries and (B, Hk, L, D) keys/values in,
    ((B, T, Hq, D) output, None) out."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not kwargs.pop("prompt_causal", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    B, Hq, T, D = query.shape
    P = key.shape[2] - T  # prompt positions before the completion
    padded = torch.cat([query.new_zeros((B, Hq, P, D)), query], dim=2) if P else query  # (B, Hq, P + T, D)
    if kept_outputs.active() and not dropout and padded.device.type == "cpu":  # a checkpointed layer keeps the result
        out = _KeptAttention.apply(padded, key, value, scaling)
    else:
        out = F.scaled_dot_product_attention(
            padded, key, value, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=Hq != key.shape[1]
        )  # (B, Hq, P + T, D)
    return out[:, :, P:].transpose(1, 2).contiguous(), None  # (B, T, Hq, D)


class _KeptAttention(torch.autograd.Function):
    """CPU causal SDPA (torch's flash kernel, as F.scaled_dot_product_attention runs it here, GQA included)
    whose replay takes the stored output instead of running the kernel again."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float | None) -> Tensor:
        kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out, lse = kept_outputs.result(NAME, lambda: kernel(q, k, v, 0.0, True, scale=scale))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out  # (B, Hq, L, D)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad.contiguous(), q, k, v, out, lse, 0.0, True, scale=ctx.scale
        )
        return dq, dk, dv, None


def supported(config) -> bool:
    return _TORCH >= (2, 5) and getattr(config, "_attn_implementation", None) == "sdpa" and full_attention(config)  # SDPA's enable_gqa


def full_attention(config) -> bool:
    """A decoder of MODEL_TYPES whose every layer attends to all earlier positions (no sliding window)."""
    return (
        getattr(config, "model_type", None) in MODEL_TYPES
        and not getattr(config, "use_sliding_window", False)
        and all(t == "full_attention" for t in getattr(config, "layer_types", None) or ())
    )


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # masks exactly as for "sdpa"


@contextlib.contextmanager
def prompt_causal_attention(config) -> Iterator[bool]:
    """Inside the block, the model of `config` attends through NAME (yields whether it does)."""
    if not supported(config):
        yield False
        return
    _register()
    config._attn_implementation = NAME
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"


def marks(config, prompt_padded: bool, completion_len: int) -> dict:
    """The kwargs the completion pass adds to its forward: the mark, where NAME is active and it applies."""
    if getattr(config, "_attn_implementation", None) != NAME or prompt_padded or completion_len < MIN_COMPLETION:
        return {}
    return {"prompt_causal": True}
