"""The lean decoder: Llama, Qwen2, Qwen3, Mistral, Phi-3, Olmo-2, Gemma-2 and Gemma-3 models run over slots.

Decoding a small batch reads every weight once per token; what a transformers forward adds on top is
Python: module calls, hooks, mask building, cache classes, separate q/k/v and gate/up matmuls. This module
runs the same arithmetic as the transformers forward in one loop over the layers: q/k/v fused into one
matmul and gate/up into another, the model's own rotary embedding and RMSNorm weights. Where the families
differ (norm placement, q/k norms, sliding windows, attention scale and soft-capping) the loop reads
lean_family.py's description of the model; q/k norms are applied to the fused q/k/v output before the
attention, so the C kernel (which rotates) and the torch path both get normed heads.

Key/value storage is per slot (slot_storage.py): a finished row's slot is refilled in place by `prefill`
with a new sequence, and storage follows the longest live row, not the budget. `release()` frees it (before
the update phase).

On the CPU in float32 a decode step's attention (rotary embedding, key/value store, attention, each row
over its own length) runs in a small C kernel (thinkrl/accel/decode_kernel.py) on every layer whose sliding
window, if any, still holds the whole sequence; elsewhere (a binding window, soft-capping, other devices and
dtypes) in torch operations and SDPA with a mask. The storage keeps every position, windowed layers too.

Each generation call starts by packing the (just refreshed) weights for oneDNN (thinkrl/accel/packed.py;
plain F.linear where that does not apply); `release()` drops the packed copy with the storage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from thinkrl import accel
from thinkrl.accel.decode_kernel import DecodeStep
from thinkrl.accel.packed import PackedLinear
from thinkrl.rollout.engines import lean_family
from thinkrl.rollout.engines.lean_family import SUPPORTED, Family, Layer, capped_attention, read_layer, window_mask
from thinkrl.rollout.engines.slot_storage import SlotStorage

__all__ = ["SUPPORTED", "LeanDecoder"]


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
        return lean_family.why_not(model)

    def __init__(self, model) -> None:
        c, body = model.config, model.model
        self.Hq, self.Hk = c.num_attention_heads, c.num_key_value_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.body, self.head = body, model.lm_head
        self.fam = Family.of(model)
        self._norm, self.act = self.fam.norm, self.fam.act  # bound once: no per-call choice of convention
        self.layers: list[Layer] = [read_layer(layer) for layer in body.layers]
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

    def reset(self, slots: int, ceiling: int | None = None) -> None:
        """Empty storage for `slots` sequences of at most `ceiling` positions, and the weights packed for them."""
        self.kv.reset(slots, self.layers[0].w_qkv, ceiling)
        self._pack(slots)

    def release(self) -> None:
        self.kv.release()
        self.linears, self.lm_head = [], None

    # -- the layer loop

    def _norm_qk(self, qkv: Tensor, q_weight: Tensor, k_weight: Tensor) -> None:
        """q_norm and k_norm on qkv (n, L, Hq + 2 Hk, D), in place, before the rotation (the transformers forward
        norms, then rotates): per head (Qwen3, Gemma-3: weights (D,)) or over all of q and all of k (Olmo-2)."""
        q, k = qkv[:, :, : self.Hq], qkv[:, :, self.Hq : self.Hq + self.Hk]
        if q_weight.shape[0] != self.D:
            q, k = q.flatten(2), k.flatten(2)  # (n, L, Hq D), (n, L, Hk D) views
        q.copy_(self._norm(q, q_weight))
        k.copy_(self._norm(k, k_weight))

    def _rotated(self, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (n, Hq, L, D), k and v (n, Hk, L, D) from a layer's qkv (n, L, Hq + 2 Hk, D), q and k rotated by
        the rotary tables cos, sin (n, L, D)."""
        Hq, Hk = self.Hq, self.Hk
        cos, sin = cos[:, :, None], sin[:, :, None]  # (n, L, 1, D) against (n, L, heads, D)
        qk = qkv[:, :, : Hq + Hk]  # q and k heads are adjacent: one rotation serves both
        half = torch.cat((-qk[..., self.D // 2 :], qk[..., : self.D // 2]), dim=-1)  # rotate-half
        qk = (qk * cos + half * sin).to(qkv.dtype)  # (n, L, Hq + Hk, D); Olmo-2's float32 tables: rotated in float32, cast back
        q, k = qk.transpose(1, 2).split([Hq, Hk], dim=1)
        return q, k, qkv[:, :, Hq + Hk :].transpose(1, 2)

    def _layers(self, tokens: Tensor, positions: Tensor, attention) -> Tensor:
        """Hidden states after every layer for `tokens` (n, L) at `positions` (n, L). attention(tables), given
        the pass's rotary tables (Family.tables: kind -> cos, sin (n, L, D)), returns mix: mix(i, qkv) is layer
        i's attention, which keeps the keys and values of qkv (n, L, Hq + 2 Hk, D) and returns the attention
        output (n, L, Hq * D). A norm that is None in the layer is not applied (lean_family.Layer)."""
        n, L = tokens.shape
        x = self.body.embed_tokens(tokens)  # (n, L, H) Gemma's embedding module scales by sqrt(H) itself
        mix = attention(self.fam.tables(self.body.rotary_emb, x, positions))
        for i, (layer, (qkv_proj, o_proj, gate_up, down)) in enumerate(zip(self.layers, self.linears)):
            h = x if layer.norm1 is None else self._norm(x, layer.norm1)
            qkv = qkv_proj(h).view(n, L, self.Hq + 2 * self.Hk, self.D)
            if layer.qk_norm is not None:
                self._norm_qk(qkv, *layer.qk_norm)
            out = o_proj(mix(i, qkv))
            x += out if layer.post_attn is None else self._norm(out, layer.post_attn)  # in place: x is this pass's own
            gate, up = gate_up(x if layer.norm2 is None else self._norm(x, layer.norm2)).chunk(2, dim=-1)
            out = down(self.act(gate) * up)
            x += out if layer.post_mlp is None else self._norm(out, layer.post_mlp)
        return x

    def _logits(self, x: Tensor) -> Tensor:
        assert self.lm_head is not None, "reset() packs the weights before any pass"
        logits = self.lm_head(self._norm(x, self.body.norm.weight))
        cap = self.fam.final_softcap  # the model's own logits (Gemma-2): the sampler's distribution is the forward's
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False, gqa: bool = False) -> Tensor:
        """Attention of q (.., Lq, D) over k, v (.., Lk, D) at the family's scale, soft-capped where it caps;
        `mask` bool, or `causal` alone; `gqa`: q has Hq heads against k's Hk (else they broadcast)."""
        if self.fam.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.fam.scale, enable_gqa=gqa)
        if gqa:  # each key head repeated for its group of query heads
            k, v = (t.repeat_interleave(self.Hq // self.Hk, dim=1) for t in (k, v))
        if causal:
            mask = window_mask(torch.arange(q.shape[-2], device=q.device), k.shape[-2], None)
        return capped_attention(q, k, v, mask, self.fam.scale or self.D**-0.5, self.fam.softcap)

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
        # a window that binds within the prompt: an explicit mask (L, L); else plain causal attention
        masks = {w: window_mask(pos[0], L, w) for w in set(self.fam.windows) if w is not None and w < L}
        kinds, windows = self.fam.kinds, self.fam.windows

        def attention(tables):
            def mix(i: int, qkv: Tensor) -> Tensor:
                q, k, v = self._rotated(qkv, *tables[kinds[i]])
                self.kv.keys[i][slots, :, :L] = k.index_select(0, which)  # a prompt's pad positions are overwritten later
                self.kv.values[i][slots, :, :L] = v.index_select(0, which)
                # causal: pads come after every real token
                mask = masks.get(windows[i])
                att = self._attend(q, k, v, mask, mask is None, self.Hq != self.Hk)  # (U, Hq, L, D)
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
        x = self._layers(tokens[:, None], positions[:, None], self._decode_attention(positions, end))  # (n, 1, H)
        self.kv.lengths[: len(positions)] = positions + live.long()
        return self._logits(x)[:, 0]  # (n, V)

    def _decode_attention(self, positions: Tensor, end: int):
        """The kernel (float32 CPU, no soft-cap) on every layer whose window, if any, holds all `end` positions
        (so on all of a Llama's, always); masked SDPA on the others and everywhere the kernel does not apply."""
        kernel = accel.decode_attention_usable(self.kv.keys[0]) and self.fam.softcap is None
        if kernel and (self.fam.narrowest is None or end <= self.fam.narrowest):
            return self._in_kernel(positions, end)
        if not kernel:
            return self._in_sdpa(positions, end)
        in_kernel, in_sdpa = self._in_kernel(positions, end), self._in_sdpa(positions, end)
        binds = [w is not None and end > w for w in self.fam.windows]

        def attention(tables):
            by_kernel, by_sdpa = in_kernel(tables), in_sdpa(tables)
            return lambda i, qkv: by_sdpa(i, qkv) if binds[i] else by_kernel(i, qkv)

        return attention

    def _in_kernel(self, positions: Tensor, end: int):
        """A decode step's attention in the C kernel (float32 CPU, decode_kernel.py): rotate, store, attend."""
        n, Hq, Hk, D, kinds = len(positions), self.Hq, self.Hk, self.D, self.fam.kinds
        scale = self.fam.scale or D**-0.5

        def attention(tables):
            steps = {kind: DecodeStep(positions, cs.view(n, D), sn.view(n, D), Hk, Hq // Hk, scale) for kind, (cs, sn) in tables.items()}
            return lambda i, qkv: steps[kinds[i]](qkv.view(n, Hq + 2 * Hk, D), self.kv.keys[i], self.kv.values[i]).view(n, 1, Hq * D)

        return attention

    def _in_sdpa(self, positions: Tensor, end: int):
        """A decode step's attention in SDPA. Row (slot, head, position) of each layer's storage viewed as
        (S * Hk * C, D): one index_copy_ writes every slot's new key at its own position (cheaper than
        advanced-index assignment, measured). Rows all at one position (one prompt's group before any refill)
        attend to every stored position there, with no mask, unless a window binds."""
        n, Hq, Hk, D, device = len(positions), self.Hq, self.Hk, self.D, positions.device
        heads = torch.arange(n, device=device)[:, None] * Hk + torch.arange(Hk, device=device)  # (n, Hk)
        at = (heads * self.kv.capacity + positions[:, None]).reshape(-1)  # (n Hk,)
        aligned = int(positions.min()) == end - 1
        masks = {w: window_mask(positions, end, w)[:, None, None] for w in set(self.fam.windows) if w is not None and end > w}
        masks[None] = None if aligned else window_mask(positions, end, None)[:, None, None]  # (n, 1, 1, end)
        kinds, windows = self.fam.kinds, self.fam.windows

        def attention(tables):
            def mix(i: int, qkv: Tensor) -> Tensor:
                q, k, v = self._rotated(qkv, *tables[kinds[i]])
                self.kv.keys[i].view(-1, D).index_copy_(0, at, k.reshape(n * Hk, D))
                self.kv.values[i].view(-1, D).index_copy_(0, at, v.reshape(n * Hk, D))
                # the Hq / Hk query heads that share a key head go in as that head's queries: one attention per
                # key head instead of repeating keys per query head (enable_gqa): 6-40% less attention time on
                # CPU, measured
                grouped = q.reshape(n, Hk, Hq // Hk, D)  # (n, Hk, G, D)
                keys, values = self.kv.keys[i][:n, :, :end], self.kv.values[i][:n, :, :end]  # (n, Hk, end, D) views
                return self._attend(grouped, keys, values, masks.get(windows[i], masks[None])).view(n, 1, Hq * D)

            return mix

        return attention
