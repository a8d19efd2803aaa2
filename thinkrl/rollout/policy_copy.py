"""The weights rollouts are sampled with: the policy, or a copy of it at another precision or staleness.

A real RL stack samples with an inference engine (vLLM, SGLang) whose weights and kernels differ from the
trainer's: bf16 or fp8 weights, a policy a few updates old. The mismatch between the sampler's log-probs
(mu, recorded as behav_logp) and the trainer's (pi_old) is what TIS/MIS, AIS, DPPO and DRPO are about, so
thinkrl can produce it on one machine:

    rollout.precision  same   sample with the trainer's weights (LoRA merged into a plain copy: faster decode);
                              a full fine-tune's float32 masters that compute in bfloat16 (models.load_policy)
                              sample with a copy cast to the compute dtype, the weights its forwards use
                       bf16   a copy cast to bfloat16 (weights and activations)
                       fp16   a copy cast to float16
                       fp8    linear weights fake-quantised to float8 e4m3 with one scale per output channel
                              (the output head stays as is, as fp8 inference engines do); activations keep
                              the trainer's compute dtype
                       fp4    float4 e2m1 (8 magnitudes, 0 to 6) with one scale per 16 weights of a row, as
                              NVFP4: a far larger gap, the positive control of a correction's probe
                              (thinkrl/probe); no engine runs it
    rollout.staleness  k      sample with the trainable weights of k steps ago (a FIFO of snapshots, saved in
                              checkpoints so --resume continues it)

An engine that loads the LoRA adapters itself (vllm_server) gets `adapters_only`: no merged copy is made, and
refresh() only chooses the adapters it samples with (`adapters`).

The copy is rebuilt from the policy before every rollout; the trainer never changes dtype.
"""

from __future__ import annotations

import copy
from collections import deque

import torch
from torch import Tensor, nn

from thinkrl.models import compute_dtype
from thinkrl.sharding import full

FP8_MAX = 448.0  # largest finite float8 e4m3 value
CAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def fake_fp8(w: Tensor) -> Tensor:
    """w rounded to float8 e4m3 with a per-output-channel (row) scale, returned in w's dtype.  (O, I) -> (O, I)"""
    scale = w.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX  # (O, 1)
    q = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(w.dtype)


FP4_LEVELS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # the magnitudes float4 e2m1 can hold
FP4_BLOCK = 16  # weights per scale, as NVFP4


def fake_fp4(w: Tensor, block: int = FP4_BLOCK) -> Tensor:
    """w rounded to the nearest float4 e2m1 value with one scale per block of `block` consecutive input weights
    (the block's absmax -> 6), in w's dtype. A scale per whole row would leave most weights of a row at 0 (one
    outlier sets it), which ruins a small model; real fp4 formats scale blocks (NVFP4: 16, MXFP4: 32). The
    scales stay float32 here (NVFP4 stores them as e4m3). torch has no float4 arithmetic, so the rounding is a
    nearest-level lookup.  (O, I) -> (O, I)"""
    rows, cols = w.shape
    pad = -cols % block  # a last, partial block is padded with zeros, which round to 0 and are dropped
    x = torch.nn.functional.pad(w.float(), (0, pad)).view(rows, -1, block)  # (O, I / block, block)
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 6.0  # (O, I / block, 1)
    x = x / scale
    levels = FP4_LEVELS.to(x.device)
    # the nearest level by the midpoints between levels, with no (..., 8) temporary; ties go to the smaller level
    nearest = levels[torch.bucketize(x.abs(), (levels[1:] + levels[:-1]) / 2)]
    q = (torch.sign(x) * nearest * scale).view(rows, -1)[:, :cols]  # (O, I)
    return q.to(w.dtype)


QUANTISE = {"fp8": fake_fp8, "fp4": fake_fp4}


def _linear_weights(model) -> set[str]:
    """Names of the weights of every nn.Linear except the output head (those fp8 engines quantise)."""
    head = model.get_output_embeddings()
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head}


class PolicySampler:
    """`refresh()` returns the model to sample this step's rollout with."""

    def __init__(self, policy, precision: str = "same", staleness: int = 0, copy_always: bool = False, adapters_only: bool = False) -> None:
        if precision not in ("same", "bf16", "fp16", *QUANTISE):
            raise ValueError(f"rollout.precision={precision!r}: choose same, bf16, fp16, fp8 or fp4")
        self.policy, self.precision, self.staleness = policy, precision, staleness
        self.lora = hasattr(policy, "peft_config")
        self.history: deque[dict[str, Tensor]] = deque(maxlen=staleness + 1)
        self._pairs: list = []
        self._source: dict[str, Tensor] | None = None  # the snapshot the last refresh() built from (None = current)
        self.version = 0  # bumped whenever the sampling weights may have changed
        self._built: dict[str, Tensor] | None = None  # LoRA: the adapter weights the sampling weights hold now
        # an engine that loads the LoRA adapters itself (vllm_server) needs only them chosen: no merged copy
        self.adapters_only = adapters_only and self.lora
        cast = CAST.get(precision)
        if not self.lora and cast is None and compute_dtype(policy) != next(policy.parameters()).dtype:
            cast = compute_dtype(policy)  # float32 masters computing in bfloat16: sample with the weights as computed
        if self.adapters_only or (not self.lora and cast is None and precision == "same" and staleness == 0 and not copy_always):
            self.model = policy  # or full fine-tuning at the trainer's precision: sample with the policy itself
            return
        if self.lora:
            from peft.tuners.lora import LoraLayer

            # decoding through unmerged adapters costs two extra matmuls per layer per token; merging costs
            # one small matmul per layer per step
            self.model = copy.deepcopy(policy).merge_and_unload()
            targets = dict(self.model.named_modules())
            layers = [(n, m) for n, m in policy.get_base_model().named_modules() if isinstance(m, LoraLayer)]
            # (LoRA layer, its name in the policy, the merged copy's linear layer it writes)
            self._pairs = [(m, f"base_model.model.{n}", targets[n]) for n, m in layers]
            fixed = _linear_weights(self.model) - {f"{n}.weight" for n, _ in layers}
        else:
            # a cast copy is made parameter by parameter in its own dtype: a whole copy in the policy's float32
            # first would, for a moment, double the largest thing on the device
            memo = {id(p): nn.Parameter(p.detach().to(cast), requires_grad=False) for p in policy.parameters()} if cast else {}
            self.model = copy.deepcopy(policy, memo)
            fixed = set()
        self.model.eval().requires_grad_(False)
        if cast is not None:
            self.model.to(cast)
        self._quantised = _linear_weights(self.model) if precision in QUANTISE else set()
        with torch.no_grad():  # frozen weights outside the LoRA targets: transform once
            for name, p in self.model.named_parameters():
                if name in fixed and name in self._quantised:
                    p.copy_(QUANTISE[precision](p))

    @property
    def trainable(self) -> dict[str, Tensor]:
        """The policy's trainable parameters, looked up at each use: FSDP replaces the parameter objects when
        it shards them (thinkrl/sharding.py)."""
        return {n: p for n, p in self.policy.named_parameters() if p.requires_grad}

    @property
    def adapters(self) -> dict[str, Tensor] | None:
        """LoRA: the adapter weights the sampling copy holds now (set by restore(); None after historical())."""
        return self._built

    def _changed(self):
        """Mark the sampling model's weights as new (engines that hold their own copy, vLLM, push again)."""
        self.version += 1
        self.model.__dict__["_thinkrl_weights_version"] = self.version
        return self.model.eval()

    @torch.no_grad()
    def refresh(self, current: bool = False):
        """Rebuild the sampling weights from the policy (from the snapshot of `staleness` steps ago unless
        `current`); call once before each rollout, which also records this step's snapshot."""
        if self.model is self.policy and not self.adapters_only:
            return self._changed()
        self._source = None
        if self.staleness and not current:
            self.history.append(self.snapshot())
            if len(self.history) > 1:  # sample with the oldest snapshot: k steps ago (or the start)
                self._source = self.history[0]
        return self.restore()

    def snapshot(self) -> dict[str, Tensor]:
        """A copy of the policy's trainable weights (the LoRA adapters, or every weight), whole even when
        FSDP shards them (every rank must then call it)."""
        return {n: full(p.detach()).clone() for n, p in self.trainable.items()}

    @torch.no_grad()
    def historical(self, state: dict[str, Tensor]):
        """The sampling model with these trainable weights (a Thinking Seeds checkpoint); `restore()` after."""
        self._rebuild(state)
        self._built = None  # historical weights: the next restore() rebuilds
        return self._changed()

    @torch.no_grad()
    def restore(self):
        """Rebuild the weights the last refresh() chose, without recording a snapshot. With LoRA, nothing is
        rebuilt when the sampling weights already hold those adapters (a refresh just before, say): merging
        costs a full copy of the weights, and an engine with its own copy (vLLM) would load them again."""
        if self.model is self.policy and not self.adapters_only:
            return self._changed()
        wanted = self._source
        if self.lora:  # a few MB of adapters, compared with what the sampling weights hold
            wanted = self.snapshot() if wanted is None else wanted
            if self._built is not None and all(torch.equal(self._built[n], t) for n, t in wanted.items()):
                return self.model.eval()
            self._built = wanted
        if not self.adapters_only:
            self._rebuild(wanted)
        return self._changed()

    def _rebuild(self, state: dict[str, Tensor] | None) -> None:
        """Write the sampling weights from `state` (trainable weights by name; None: the policy's own), one
        layer at a time; a sharded policy's weights are gathered here (thinkrl/sharding.py)."""
        weight = lambda name, p: state[name] if state is not None and name in state else full(p.detach())  # noqa: E731
        if self.lora:
            params = dict(self.policy.named_parameters())
            for lora, name, target in self._pairs:
                key = lora.active_adapters[0]
                a, b = (f"{name}.lora_{x}.{key}.weight" for x in "AB")
                delta = (weight(b, params[b]) @ weight(a, params[a])) * lora.scaling[key]  # (out, r) @ (r, in)
                w = full(lora.base_layer.weight.detach()) + (delta.T if lora.fan_in_fan_out else delta)
                target.weight.copy_(self._transform(w, True))
        else:
            params = dict(self.model.named_parameters())
            for name, p in self.policy.named_parameters():
                params[name].copy_(self._transform(weight(name, p), name in self._quantised))

    def _transform(self, w: Tensor, linear: bool) -> Tensor:
        return QUANTISE[self.precision](w) if linear and self.precision in QUANTISE else w  # copy_ casts for bf16 / fp16

    def state_dict(self) -> dict:
        """The staleness FIFO (empty without staleness): saved in checkpoints for an exact resume."""
        return {"history": [{n: t.cpu() for n, t in s.items()} for s in self.history]}

    def load_state_dict(self, state: dict) -> None:
        device = next(iter(self.trainable.values())).device if self.trainable else "cpu"
        self.history.clear()
        for snap in state.get("history", []):
            self.history.append({n: t.to(device) for n, t in snap.items()})
