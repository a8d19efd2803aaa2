"""TokenBatch: the one typed input of every policy loss.

Shape letters used across thinkrl: B = sequences (prompts x G), G = group size, T = completion length
(prompt excluded), V = vocabulary, K = top-K width. Every per-token field is (B, T).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

_NO_GRAD = ("old_logp", "behav_logp", "advantages", "entropy", "old_entropy", "ref_logp", "token_js", "topk_old_logp", "is_weights")
_PER_TOKEN = ("logp", "old_logp", "behav_logp", "advantages", "prefix_mask", "entropy", "old_entropy", "ref_logp", "token_js", "is_weights", "token_ids")
_TOPK = ("topk_ids", "topk_old_logp", "topk_logp")


@dataclass
class TokenBatch:
    logp: Tensor  # (B, T) log pi_theta(y_t), carries grad
    old_logp: Tensor  # (B, T) log pi_old(y_t): policy at the start of this update phase
    behav_logp: Tensor  # (B, T) log mu(y_t): whoever sampled the token
    advantages: Tensor  # (B, T) per-sequence advantage broadcast over tokens; (B,) is broadcast for you
    mask: Tensor  # (B, T) 1 = generated token that is trained on, 0 = padding
    token_ids: Tensor | None = None  # (B, T) long, the sampled ids y_t (methods that look tokens up by id)
    prefix_mask: Tensor | None = None  # (B, T) 1 = token from a historical-checkpoint prefix
    entropy: Tensor | None = None  # (B, T) entropy of pi_theta's next-token distribution (detached)
    old_entropy: Tensor | None = None  # (B, T) entropy of pi_old
    ref_logp: Tensor | None = None  # (B, T) reference model log-prob (KL)
    topk_ids: Tensor | None = None  # (B, T, K) top-K ids of the proposal distribution
    topk_old_logp: Tensor | None = None  # (B, T, K) proposal log-probs there
    topk_logp: Tensor | None = None  # (B, T, K) pi_theta log-probs there (carries grad)
    token_js: Tensor | None = None  # (B, T) JS divergence of each position to the batch mean
    is_weights: Tensor | None = None  # (B, T) rollout-correction weights (TIS/MIS), multiply the per-token loss
    num_tokens: int | None = None  # global count of mask == 1 tokens in the whole update batch
    num_seqs: int | None = None  # global count of sequences in the update batch
    generator: torch.Generator | None = None  # for methods that draw random numbers

    def __post_init__(self) -> None:
        if self.logp.dim() != 2:
            raise ValueError(f"logp must be (B, T), got shape {tuple(self.logp.shape)}")
        shape = self.logp.shape
        if self.advantages.dim() == 1:
            self.advantages = self.advantages[:, None].expand(shape)
        self.mask = self.mask.bool()
        if self.mask.shape != shape:
            raise ValueError(f"mask has shape {tuple(self.mask.shape)}, expected {tuple(shape)}")
        for name in _PER_TOKEN + _TOPK:
            value = getattr(self, name)
            if value is None:
                continue
            want = shape if name in _PER_TOKEN else None
            if want is not None and value.shape != want:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(want)}")
            if name in _TOPK and value.shape[:2] != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected ({shape[0]}, {shape[1]}, K)")
            if name in _NO_GRAD and value.requires_grad:
                raise ValueError(f"{name} must not carry grad (detach it)")
            # Zero-fill padding once, here, so no method can let junk at mask == 0 reach the loss or the
            # gradient (torch.where passes no gradient to the unselected branch).
            m = self.mask if value.dim() == 2 else self.mask[..., None]
            setattr(self, name, torch.where(m, value, torch.zeros((), dtype=value.dtype)))
        if self.num_tokens is None:
            self.num_tokens = int(self.mask.sum())
        if self.num_seqs is None:
            self.num_seqs = shape[0]

    def split(self, sizes: list[int]) -> list[TokenBatch]:
        """Micro-batches along B that keep the global num_tokens / num_seqs (for tests and the trainer)."""
        out, start = [], 0
        for n in sizes:
            fields = {}
            for f in dataclasses.fields(self):
                v = getattr(self, f.name)
                fields[f.name] = v[start : start + n] if isinstance(v, Tensor) else v
            out.append(TokenBatch(**fields))
            start += n
        return out


# ---------------------------------------------------------------- model -> per-token log-probs

CHUNK_ELEMS = 2**25  # logits elements per chunk (128 MB in float32): bounds memory for any B, T, V


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompt ids, attention mask and position ids, each (U, Lp)."""
    Lp = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), Lp), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), Lp), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, Lp - len(p) :] = torch.tensor(p)
        attn[i, Lp - len(p) :] = 1
    ids, attn = ids.to(device), attn.to(device)
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def cache_kwarg(model) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x; accept both."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _body_and_head(model):
    """The transformer body (hidden states) and the output head of a (peft-wrapped) causal LM."""
    base = model.module if hasattr(model, "module") else model  # DDP wrapper
    base = base.get_base_model() if hasattr(base, "get_base_model") else base  # peft: LoRA layers stay active
    return base.get_decoder(), base.get_output_embeddings(), base.config


def _logits(head, config, hidden: Tensor, temperature: float) -> Tensor:
    """Tempered float32 logits of N hidden states, with the model's own scaling/softcapping.  (N, H) -> (N, V)"""
    logits = head(hidden).float()  # (N, V)
    if getattr(config, "logit_scale", None):
        logits = logits * config.logit_scale
    if getattr(config, "final_logit_softcapping", None):
        cap = config.final_logit_softcapping
        logits = torch.tanh(logits / cap) * cap
    return logits / temperature


def _head_logp(head, config, hidden: Tensor, targets: Tensor, temperature: float, want_entropy: bool, topk_ids: Tensor | None):
    """log-prob of targets (N,), detached entropy (N,), and log-probs at topk_ids (N, K) for N hidden states.
    Plain autograd; the common case (no top-K, no logit scaling) goes through _FusedHead instead."""
    logits = _logits(head, config, hidden, temperature)  # (N, V)
    logz = torch.logsumexp(logits, -1)  # (N,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz  # (N,)
    topk = logits.gather(-1, topk_ids) - logz[:, None] if topk_ids is not None else logp.new_zeros((len(logp), 0))  # (N, K)
    if not want_entropy:
        return logp, torch.zeros_like(logp.detach()), topk
    with torch.no_grad():
        ent = logz - (torch.softmax(logits, -1) * logits).sum(-1)  # (N,)  H = log Z - E_p[logit]
    return logp, ent, topk


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """sum(a * b, -1) without an (N, V) temporary.  (N, V), (N, V) -> (N,)"""
    return (a[:, None, :] @ b[:, :, None]).squeeze(-1).squeeze(-1)


class _FusedHead(torch.autograd.Function):
    """log pi(y) and the entropy of softmax(h W^T / T) over N positions, with the backward written out:
    d log pi(y) / d logits = (onehot(y) - p) / T. Autograd through logsumexp + gather spends about twice as
    many full-vocabulary passes (the profile's largest non-matmul cost in a training step). keep=True saves p
    (N, V) for the backward; keep=False saves only h and log Z and recomputes p, which bounds memory when a
    micro-batch is cut into several chunks."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, keep: bool):
        logits = (hidden @ weight.t()).float()  # (N, V)
        if temperature != 1.0:
            logits.div_(temperature)
        logz = torch.logsumexp(logits, -1)  # (N,)
        logp_all = logits.sub_(logz[:, None])  # (N, V) log p, in place
        p = logp_all.exp()  # (N, V)
        entropy = -_row_dot(p, logp_all)  # (N,)
        logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # (N,)
        ctx.temperature, ctx.keep = temperature, keep
        ctx.save_for_backward(hidden, weight, targets, p if keep else logz)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, _grad_entropy):
        hidden, weight, targets, saved = ctx.saved_tensors
        T = ctx.temperature
        if ctx.keep:
            p = saved
        else:  # recompute p from h and log Z
            p = (hidden @ weight.t()).float()
            if T != 1.0:
                p.div_(T)
            p = p.sub_(saved[:, None]).exp_()
        g = grad_logp.float() / T  # (N,)
        grad_logits = p * -g[:, None]  # (N, V)
        grad_logits.scatter_add_(-1, targets[:, None], g[:, None])  # + onehot(y) g
        grad_logits = grad_logits.to(hidden.dtype)
        grad_h = grad_logits @ weight if ctx.needs_input_grad[0] else None  # (N, H)
        grad_w = grad_logits.t() @ hidden if ctx.needs_input_grad[1] else None  # (V, H)
        return grad_h, grad_w, None, None, None


def _plain_head(head, config) -> bool:
    """A bias-free linear head without logit scaling or softcapping: what _FusedHead computes."""
    scaled = getattr(config, "logit_scale", None) or getattr(config, "final_logit_softcapping", None)
    return isinstance(head, torch.nn.Linear) and head.bias is None and not scaled


def _hidden(model, prompts: list[list[int]], completions: Tensor, mask: Tensor, pad_id: int):
    """Hidden states (N, H) that predict each generated token (mask == 1, row-major), the targets (N,),
    and the output head and config."""
    from transformers import DynamicCache

    body, head, config = _body_and_head(model)
    if getattr(body, "gradient_checkpointing", False) and body.training and torch.is_grad_enabled():
        return _hidden_packed(body, prompts, completions, mask, pad_id), completions[mask], head, config
    # Completions of one group share their prompt: run each distinct prompt once, with grad, and let every
    # completion attend to its (differentiable) key/value cache. Identical values and gradients to packing
    # [prompt | completion] per row, at a fraction of the cost when G completions share a prompt.
    slot: dict[tuple[int, ...], int] = {}
    which = torch.tensor([slot.setdefault(tuple(p), len(slot)) for p in prompts], device=completions.device)  # (B,)
    p_ids, p_attn, p_pos = left_pad([list(p) for p in slot], pad_id, completions.device)  # (U, Lp)
    cache = DynamicCache()
    kv = {cache_kwarg(body): cache, "use_cache": True}
    h_prompt = body(input_ids=p_ids, attention_mask=p_attn, position_ids=p_pos, **kv).last_hidden_state[:, -1]  # (U, H)
    if len(slot) < len(prompts):
        # index_select, not cache.batch_select_indices: the backward of advanced indexing with repeated
        # indices accumulates in a thread-dependent order on CPU, which made runs irreproducible
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.index_select(0, which), layer.values.index_select(0, which)
    B, T = completions.shape
    attn = torch.cat([p_attn[which], torch.ones((B, T), dtype=torch.long, device=completions.device)], dim=1)  # (B, Lp + T)
    pos = p_pos[which, -1:] + 1 + torch.arange(T, device=completions.device)  # (B, T)
    h_comp = body(input_ids=completions, attention_mask=attn, position_ids=pos, **kv).last_hidden_state  # (B, T, H)
    # the state before each generated token predicts it: last prompt state, then completion states 0..T-2
    h = torch.cat([h_prompt.index_select(0, which)[:, None], h_comp[:, :-1]], dim=1)[mask]  # (N, H)
    return h, completions[mask], head, config


def _hidden_packed(body, prompts: list[list[int]], completions: Tensor, mask: Tensor, pad_id: int) -> Tensor:
    """_hidden for gradient checkpointing, which turns the KV cache off (a replayed layer would write it
    twice): one [left-padded prompt | completion] sequence per row, no cache. Same values, more compute."""
    p_ids, p_attn, _ = left_pad(prompts, pad_id, completions.device)  # (B, Lp)
    Lp, T = p_ids.shape[1], completions.shape[1]
    attn = torch.cat([p_attn, torch.ones_like(completions)], dim=1)  # (B, Lp + T)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    h = body(input_ids=torch.cat([p_ids, completions], dim=1), attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
    return h[:, Lp - 1 : Lp - 1 + T][mask]  # (N, H): the state before each generated token


def token_logprobs(
    model,
    prompts: list[list[int]],
    completions: Tensor,
    mask: Tensor,
    pad_id: int,
    temperature: float,
    entropy: bool = False,
    topk_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor | None, Tensor]:
    """log pi(y_t) (B, T) under softmax(logits / temperature), and optionally its entropy (B, T).

    With topk_ids (B, T, K) also returns log pi at those ids (B, T, K), a third value. The head runs only
    on generated positions (mask == 1), in chunks; under autograd each chunk is checkpointed, so no
    (B, T, V) float32 logits exist at once, forward or backward.
    """
    h, y, head, config = _hidden(model, prompts, completions, mask, pad_id)
    ids = topk_ids[mask] if topk_ids is not None else None  # (N, K)
    rows = max(1, CHUNK_ELEMS // head.weight.shape[0])
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    fused = ids is None and _plain_head(head, config)
    for s in range(0, h.shape[0], rows):
        if fused:  # one chunk: keep p for the backward; several: recompute it, as checkpointing would
            lp, ent = _FusedHead.apply(h[s : s + rows], head.weight, y[s : s + rows], temperature, h.shape[0] <= rows)
            parts.append((lp, ent, lp.new_zeros((len(lp), 0))))
            continue
        args = (head, config, h[s : s + rows], y[s : s + rows], temperature, entropy, ids[s : s + rows] if ids is not None else None)
        if torch.is_grad_enabled() and h.shape[0] > rows:
            from torch.utils.checkpoint import checkpoint

            parts.append(checkpoint(_head_logp, *args, use_reentrant=False))
        else:
            parts.append(_head_logp(*args))
    lp, ent, topk = (torch.cat(x) for x in zip(*parts)) if parts else (h.new_zeros(0), h.new_zeros(0), h.new_zeros((0, 0)))
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=h.device).masked_scatter(mask, lp)  # (B, T)
    ent = torch.zeros(mask.shape, dtype=torch.float32, device=h.device).masked_scatter(mask, ent) if entropy else None
    if topk_ids is None:
        return logp, ent
    K = topk_ids.shape[-1]
    out = torch.zeros((*mask.shape, K), dtype=torch.float32, device=h.device)
    return logp, ent, out.masked_scatter(mask[..., None].expand_as(out), topk)  # (B, T, K)


@torch.no_grad()
def visit_distributions(model, prompts: list[list[int]], completions: Tensor, mask: Tensor, pad_id: int, temperature: float, visit) -> None:
    """Call visit(logp (n, V), start) for consecutive chunks of the N generated positions (row-major over
    mask == 1), logp being the tempered next-token log-distribution: for statistics that need the whole
    vocabulary (top-K, JS divergence) without ever holding (B, T, V) of it."""
    h, _, head, config = _hidden(model, prompts, completions, mask, pad_id)
    rows = max(1, CHUNK_ELEMS // head.weight.shape[0])
    for s in range(0, h.shape[0], rows):
        visit(torch.log_softmax(_logits(head, config, h[s : s + rows], temperature), -1), s)


class PolicyLogProbs(torch.nn.Module):
    """The policy as one module whose forward is token_logprobs: what Accelerate wraps in DDP/FSDP/DeepSpeed.

    token_logprobs runs the decoder body and the output head as separate calls (shared prompt cache, head
    on generated positions only). A wrapper such as DDP prepares its gradient all-reduce in its own
    forward, so those calls must happen inside it; wrapping this module does that. `.policy` is the
    transformers / peft model itself (sampling, checkpoints, export)."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, prompts, completions, mask, pad_id: int, temperature: float, entropy: bool = False, topk_ids=None):
        return token_logprobs(self.policy, prompts, completions, mask, pad_id, temperature, entropy, topk_ids)
