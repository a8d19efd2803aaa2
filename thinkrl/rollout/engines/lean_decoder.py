"""The lean decoder: Llama-shaped models (Llama, SmolLM2, Qwen2 and Qwen3 without sliding windows) run over slots.

Decoding a small batch reads every weight once per token; what a transformers forward adds on top is
Python: module calls, hooks, mask building, cache classes, separate q/k/v and gate/up matmuls. This module
runs the same arithmetic as the transformers forward in one loop over the layers: q/k/v fused into one
matmul and gate/up into another, the model's own rotary embedding and RMSNorm weights. Qwen3 adds an RMSNorm
over each query and key head before the rotary embedding (q_norm, k_norm): applied to the fused q/k/v output
before the attention, so the C kernel (which rotates) and the torch path both get normed heads.

Key/value storage is per slot (slot_storage.py): a finished row's slot is refilled in place by `prefill`
with a new sequence, and storage follows the longest live row, not the budget. `release()` frees it (before
the update phase).

On the CPU in float32 a decode step's attention (rotary embedding, key/value store, attention, each row
over its own length) runs in a small C kernel (thinkrl/accel/decode_kernel.py); elsewhere in torch operations and SDPA.

Each generation call starts by packing the (just refreshed) weights for oneDNN (thinkrl/accel/packed.py;
plain F.linear where that does not apply); `release()` drops the packed copy with the storage.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from thinkrl import accel
from thinkrl.accel.decode_kernel import DecodeStep
from thinkrl.accel.packed import PackedLinear
from thinkrl.rollout.engines.slot_storage import SlotStorage

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def _sliding_window(c) -> int | None:
    """The window a config's attention slides over: Qwen2 and Qwen3 switch theirs on with use_sliding_window,
    Mistral's applies whenever set."""
    return getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", True) else None


# what the fused loop assumes of a config beyond its architecture, one row each: (what a refusal says of the
# value, how to read it, the values the loop runs)
ASSUMED = (
    ("activation {} (it runs silu)", lambda c: getattr(c, "hidden_act", None), ("silu",)),
    ("mlp_bias={} (it runs MLPs without biases)", lambda c: bool(getattr(c, "mlp_bias", False)), (False,)),
    ("pretraining_tp={} (it runs 1)", lambda c: getattr(c, "pretraining_tp", None) or 1, (1,)),
    ("a sliding window of {} tokens (it runs full attention)", _sliding_window, (None,)),
)


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


class _Layer(NamedTuple):
    """One decoder layer's weights; the fused matrices are views shared with the model's modules (_fuse)."""

    norm1: Tensor
    w_qkv: Tensor
    b_qkv: Tensor | None
    w_o: Tensor
    b_o: Tensor | None
    norm2: Tensor
    w_gate_up: Tensor
    w_down: Tensor
    qk_norm: tuple[Tensor, Tensor] | None  # Qwen3's per-head q and k RMSNorm weights (D,); None for Llama, Qwen2


class LeanDecoder:
    """Fused weights of one model (built once, `for_model`) and the key/value storage of its slots."""

    @staticmethod
    def for_model(model) -> LeanDecoder:
        if "_thinkrl_lean" not in model.__dict__:
            model.__dict__["_thinkrl_lean"] = LeanDecoder(model)
        return model.__dict__["_thinkrl_lean"]

    @staticmethod
    def supports(model) -> bool:
        return LeanDecoder.why_not(model) is None

    @staticmethod
    def why_not(model) -> str | None:
        """Why the fused loop does not decode `model` (None: it does): every condition it fails, for the run's
        startup line (engines.describe_path)."""
        name = type(model).__name__
        why = [] if name in SUPPORTED else [f"{name} is not in the lean decoder (it covers {', '.join(SUPPORTED)})"]
        why += [say.format(value) for say, read, runs in ASSUMED if (value := read(model.config)) not in runs]
        if any(p.requires_grad for p in model.parameters()):  # _fuse would rewire the trainee's weights
            why.append("it samples with the trained policy itself, not a frozen copy (full fine-tuning, rollout.precision=same)")
        return "; ".join(why) or None

    def __init__(self, model) -> None:
        c, body = model.config, model.model
        self.Hq, self.Hk = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps, self.body, self.head = c.rms_norm_eps, body, model.lm_head
        self.layers: list[_Layer] = []
        for layer in body.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            self.layers.append(
                _Layer(
                    layer.input_layernorm.weight,
                    _fuse(qkv),
                    _fuse(qkv, "bias"),
                    a.o_proj.weight,
                    a.o_proj.bias,
                    layer.post_attention_layernorm.weight,
                    _fuse([m.gate_proj, m.up_proj]),
                    m.down_proj.weight,
                    (a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else None,
                )
            )
        self.kv = SlotStorage(len(self.layers), self.Hk, self.D)
        self.linears: list[tuple[PackedLinear, ...]] = []  # per layer: qkv, o, gate/up, down (built by reset)
        self.lm_head: PackedLinear | None = None

    def _pack(self, rows: int) -> None:
        """The weights as they are now, packed for calls of about `rows` rows (a copy: reset() runs after
        every refresh of the sampling weights, so the copy is never stale)."""
        self.linears = [
            (
                PackedLinear(layer.w_qkv, layer.b_qkv, rows),
                PackedLinear(layer.w_o, layer.b_o, rows),
                PackedLinear(layer.w_gate_up, None, rows),
                PackedLinear(layer.w_down, None, rows),
            )
            for layer in self.layers
        ]
        self.lm_head = PackedLinear(self.head.weight, self.head.bias, rows)

    def reset(self, slots: int) -> None:
        """Empty storage for `slots` sequences, and the weights packed for them."""
        self.kv.reset(slots, self.layers[0].w_qkv)
        self._pack(slots)

    def release(self) -> None:
        self.kv.release()
        self.linears, self.lm_head = [], None

    # -- the layer loop

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm as transformers computes it (float32 statistics, weight applied in the input dtype); in
        float32 as torch's one rms_norm call (the same steps; bit-equal in a check here) instead of six."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _norm_heads(self, qkv: Tensor, q_weight: Tensor, k_weight: Tensor) -> None:
        """Qwen3's q_norm and k_norm: RMSNorm over each query and key head's D values of qkv (n, L, Hq + 2 Hk, D),
        written in place, before the rotation (the transformers forward norms, then rotates)."""
        q, k = qkv[:, :, : self.Hq], qkv[:, :, self.Hq : self.Hq + self.Hk]
        q.copy_(self._norm(q, q_weight))
        k.copy_(self._norm(k, k_weight))

    def _rotated(self, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (n, Hq, L, D), k and v (n, Hk, L, D) from a layer's qkv (n, L, Hq + 2 Hk, D), q and k rotated by
        the rotary tables cos, sin (n, L, D)."""
        Hq, Hk = self.Hq, self.Hk
        cos, sin = cos[:, :, None], sin[:, :, None]  # (n, L, 1, D) against (n, L, heads, D)
        qk = qkv[:, :, : Hq + Hk]  # q and k heads are adjacent: one rotation serves both
        half = torch.cat((-qk[..., self.D // 2 :], qk[..., : self.D // 2]), dim=-1)  # rotate-half
        qk = qk * cos + half * sin  # (n, L, Hq + Hk, D)
        q, k = qk.transpose(1, 2).split([Hq, Hk], dim=1)
        return q, k, qkv[:, :, Hq + Hk :].transpose(1, 2)

    def _layers(self, tokens: Tensor, positions: Tensor, attention) -> Tensor:
        """Hidden states after every layer for `tokens` (n, L) at `positions` (n, L). attention(cos, sin),
        given the pass's rotary tables (n, L, D), returns mix: mix(i, qkv) is layer i's attention, which keeps
        the keys and values of qkv (n, L, Hq + 2 Hk, D) and returns the attention output (n, L, Hq * D)."""
        n, L = tokens.shape
        x = self.body.embed_tokens(tokens)  # (n, L, H)
        mix = attention(*self.body.rotary_emb(x, positions))
        for i, (layer, (qkv_proj, o_proj, gate_up, down)) in enumerate(zip(self.layers, self.linears)):
            qkv = qkv_proj(self._norm(x, layer.norm1)).view(n, L, self.Hq + 2 * self.Hk, self.D)
            if layer.qk_norm is not None:
                self._norm_heads(qkv, *layer.qk_norm)
            x += o_proj(mix(i, qkv))  # in place: no autograd here, x is this pass's own tensor
            gate, up = gate_up(self._norm(x, layer.norm2)).chunk(2, dim=-1)
            x += down(F.silu(gate) * up)
        return x

    def _logits(self, x: Tensor) -> Tensor:
        assert self.lm_head is not None, "reset() packs the weights before any pass"
        return self.lm_head(self._norm(x, self.body.norm.weight))

    @torch.no_grad()
    def prefill(self, slots: Tensor, prompts: list[list[int]], which: Tensor) -> Tensor:
        """Write the keys and values of `prompts` (distinct, each at least one token) into `slots` (k,), slot
        j taking prompt which[j]: one causal pass per distinct prompt, right-padded, however many slots share
        it. lengths[slot] becomes its prompt's length. Returns the logits (k, V) of each slot's first new token,
        so a request's first token costs no decode step."""
        device = self.kv.lengths.device
        sizes = torch.tensor([len(p) for p in prompts], device=device)  # (U,)
        L = int(sizes.max())
        ids = torch.zeros((len(prompts), L), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, device=device)
        self.kv.reserve(L)
        pos = torch.arange(L, device=device).expand(len(prompts), L)  # (U, L)

        def attention(cos: Tensor, sin: Tensor):
            def mix(i: int, qkv: Tensor) -> Tensor:
                q, k, v = self._rotated(qkv, cos, sin)
                self.kv.keys[i][slots, :, :L] = k.index_select(0, which)  # a prompt's pad positions are overwritten later
                self.kv.values[i][slots, :, :L] = v.index_select(0, which)
                # causal: pads come after every real token
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.Hq != self.Hk)  # (U, Hq, L, D)
                return att.transpose(1, 2).reshape(len(prompts), L, -1)

            return mix

        x = self._layers(ids, pos, attention)  # (U, L, H)
        last = x[torch.arange(len(prompts), device=device), sizes - 1]  # (U, H) each prompt's last real token
        self.kv.lengths[slots] = sizes[which]
        return self._logits(last).index_select(0, which)  # (k, V)

    @torch.no_grad()
    def step(self, tokens: Tensor, live: Tensor) -> Tensor:
        """Logits (n, V) of the token after `tokens` (n,) in slots 0..n-1, each placed at its slot's next
        position; the lengths of `live` slots (n,) bool advance by one (the others stay empty)."""
        positions = self.kv.lengths[: tokens.shape[0]]  # (n,) where each new token goes
        end = int(positions.max()) + 1
        self.kv.reserve(end)
        attention = self._in_kernel if accel.decode_attention_usable(self.kv.keys[0]) else self._in_sdpa
        x = self._layers(tokens[:, None], positions[:, None], attention(positions, end))  # (n, 1, H)
        self.kv.lengths[: len(positions)] = positions + live.long()
        return self._logits(x)[:, 0]  # (n, V)

    def _in_kernel(self, positions: Tensor, end: int):
        """A decode step's attention in the C kernel (float32 CPU, decode_kernel.py): rotate, store, attend."""
        n, Hq, Hk, D = len(positions), self.Hq, self.Hk, self.D

        def attention(cos: Tensor, sin: Tensor):
            step = DecodeStep(positions, cos.view(n, D), sin.view(n, D), Hk, Hq // Hk)
            return lambda i, qkv: step(qkv.view(n, Hq + 2 * Hk, D), self.kv.keys[i], self.kv.values[i]).view(n, 1, Hq * D)

        return attention

    def _in_sdpa(self, positions: Tensor, end: int):
        """A decode step's attention in SDPA. Row (slot, head, position) of each layer's storage viewed as
        (S * Hk * C, D): one index_copy_ writes every slot's new key at its own position (cheaper than
        advanced-index assignment, measured). Rows all at one position (one prompt's group before any refill)
        attend to every stored position there, with no mask."""
        n, Hq, Hk, D, device = len(positions), self.Hq, self.Hk, self.D, positions.device
        heads = torch.arange(n, device=device)[:, None] * Hk + torch.arange(Hk, device=device)  # (n, Hk)
        at = (heads * self.kv.capacity + positions[:, None]).reshape(-1)  # (n Hk,)
        aligned = int(positions.min()) == end - 1
        mask = None if aligned else (torch.arange(end, device=device)[None] <= positions[:, None])[:, None, None]  # (n, 1, 1, end)

        def attention(cos: Tensor, sin: Tensor):
            def mix(i: int, qkv: Tensor) -> Tensor:
                q, k, v = self._rotated(qkv, cos, sin)
                self.kv.keys[i].view(-1, D).index_copy_(0, at, k.reshape(n * Hk, D))
                self.kv.values[i].view(-1, D).index_copy_(0, at, v.reshape(n * Hk, D))
                # the Hq / Hk query heads that share a key head go in as that head's queries: one attention per
                # key head instead of repeating keys per query head (enable_gqa): 6-40% less attention time on
                # CPU, measured
                grouped = q.reshape(n, Hk, Hq // Hk, D)  # (n, Hk, G, D)
                keys, values = self.kv.keys[i][:n, :, :end], self.kv.values[i][:n, :, :end]  # (n, Hk, end, D) views
                return F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask).view(n, 1, Hq * D)

            return mix

        return attention
