"""A lean decode step for Llama-architecture models (Llama, SmolLM2, Qwen2 without sliding windows).

Decoding a small batch reads every weight once per token; what a transformers forward adds on top is
Python: module calls, hooks, mask building, cache classes, separate q/k/v and gate/up matmuls. On 2 CPU
cores that overhead was about a fifth of a decode step for SmolLM2-135M with 16 rows. This module runs the
same arithmetic as the transformers forward in one loop over the layers: q/k/v fused into one matmul and
gate/up into another, keys and values in preallocated buffers, the model's own rotary embedding and
RMSNorm weights. The prompt prefill still runs through transformers (one call), and its cache seeds the
buffers. `generate` uses it when `LeanDecoder.supports(model)`; tests/test_fastdecode.py checks it against
the transformers forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def _fuse(modules, name: str = "weight") -> Tensor | None:
    """One (out_1 + out_2 + ..., in) weight (or bias) whose row blocks become the modules' own (views of
    it), so writing module.weight in place (the sampler's refresh does) updates the fused matrix too, and
    no second copy of the weights is held."""
    if getattr(modules[0], name) is None:
        return None
    fused = torch.cat([getattr(m, name).detach() for m in modules])
    start = 0
    for m in modules:
        rows = getattr(m, name).shape[0]
        setattr(m, name, torch.nn.Parameter(fused[start : start + rows], requires_grad=False))
        start += rows
    return fused


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LeanDecoder:
    """Fused weights of one model (built once, `for_model`) and one generation's key/value buffers."""

    @staticmethod
    def for_model(model) -> LeanDecoder:
        if "_thinkrl_lean" not in model.__dict__:
            model.__dict__["_thinkrl_lean"] = LeanDecoder(model)
        return model.__dict__["_thinkrl_lean"]

    @staticmethod
    def supports(model) -> bool:
        c = model.config
        return (
            type(model).__name__ in SUPPORTED
            and getattr(c, "hidden_act", None) == "silu"
            and not getattr(c, "mlp_bias", False)
            and getattr(c, "pretraining_tp", 1) in (None, 1)
            and not getattr(c, "use_sliding_window", False)
            and not any(p.requires_grad for p in model.parameters())  # a frozen sampling copy, never the trainee
        )

    def __init__(self, model) -> None:
        c, body = model.config, model.model
        self.Hq, self.Hk = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps, self.body, self.head = c.rms_norm_eps, body, model.lm_head
        self.layers = []
        for layer in body.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            self.layers.append(
                (
                    layer.input_layernorm.weight,
                    _fuse(qkv),
                    _fuse(qkv, "bias"),
                    a.o_proj.weight,
                    a.o_proj.bias,
                    layer.post_attention_layernorm.weight,
                    _fuse([m.gate_proj, m.up_proj]),
                    m.down_proj.weight,
                )
            )

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm as transformers computes it (float32 statistics, weight applied in the input dtype)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def start(self, cache, prompt_mask: Tensor | None, max_new: int) -> None:
        """Copy the prefill cache (rows already repeated per completion) into buffers with room for max_new
        more positions; prompt_mask (B, L) marks real prompt tokens (None: no padding)."""
        B, _, L, _ = cache.layers[0].keys.shape
        self.cur = L
        self.keys, self.values = [], []
        for layer in cache.layers:
            k = layer.keys.new_empty((B, self.Hk, L + max_new, self.D))
            v = torch.empty_like(k)
            k[:, :, :L], v[:, :, :L] = layer.keys, layer.values
            self.keys.append(k)
            self.values.append(v)
        self.mask = None
        if prompt_mask is not None:
            self.mask = torch.ones((B, L + max_new), dtype=torch.bool, device=prompt_mask.device)
            self.mask[:, :L] = prompt_mask.bool()

    def select(self, rows: Tensor) -> None:
        """Keep only these rows (finished completions leave the batch)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        if self.mask is not None:
            self.mask = self.mask.index_select(0, rows)

    @torch.no_grad()
    def step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits (b, V) of the next token after `tokens` (b,) placed at `positions` (b,)."""
        b, t, Hq, Hk, D = tokens.shape[0], self.cur, self.Hq, self.Hk, self.D
        x = self.body.embed_tokens(tokens)[:, None]  # (b, 1, H)
        cos, sin = self.body.rotary_emb(x, positions[:, None])  # (b, 1, D) each
        cos, sin = cos[:, None], sin[:, None]  # (b, 1, 1, D) against (b, heads, 1, D)
        mask = self.mask[:, None, None, : t + 1] if self.mask is not None else None  # (b, 1, 1, t + 1)
        for i, (norm1, w_qkv, b_qkv, w_o, b_o, norm2, w_gu, w_down) in enumerate(self.layers):
            qkv = F.linear(self._norm(x, norm1), w_qkv, b_qkv)  # (b, 1, (Hq + 2 Hk) D)
            q, k, v = (y.view(b, 1, -1, D).transpose(1, 2) for y in qkv.split([Hq * D, Hk * D, Hk * D], dim=-1))
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            self.keys[i][:, :, t : t + 1], self.values[i][:, :, t : t + 1] = k, v
            att = F.scaled_dot_product_attention(
                q, self.keys[i][:, :, : t + 1], self.values[i][:, :, : t + 1], attn_mask=mask, enable_gqa=Hq != Hk
            )  # (b, Hq, 1, D)
            x = x + F.linear(att.transpose(1, 2).reshape(b, 1, Hq * D), w_o, b_o)
            gate, up = F.linear(self._norm(x, norm2), w_gu).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w_down)
        self.cur += 1
        return self.head(self._norm(x, self.body.norm.weight))[:, 0]  # (b, V)
