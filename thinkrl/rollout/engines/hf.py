"""The transformers engine: transformers' own continuous batching (its manager, as `generate_batch` uses it) with a
paged KV cache.

The sampling copy of the policy (merged LoRA, precision, staleness: thinkrl/rollout/policy_copy.py) is what
decodes. Requests join and leave the batch at every step, each with its own budget. The key/value cache is a
pool of pages sized in tokens, not by the budget: by default slots x (longest prompt + 256), so its memory
does not grow with rollout.max_new_tokens; when long completions fill it, transformers' scheduler runs fewer
of them at once (raise `kv_tokens` for long budgets). On CUDA it uses flash or SDPA attention (and CUDA
graphs where transformers enables them); on the CPU, SDPA.

behav_logp: transformers returns log softmax of the processed scores (temperature, then top-k and top-p
with -inf outside the kept set; greedy: the raw scores), the same distribution thinkrl/rollout/sampling.py
draws from; tests/test_engines.py checks it against the trainer's recomputed log-probs. The top-K and
entropy records, when a method needs them from the sampler, come from one extra scoring pass of the same
model over the sampled completions. transformers' continuous batching drops the min-new-tokens processor,
so rollout.min_new_tokens > 0 is refused here; so is a model using a feature its paged attention drops
(DROPPED_FEATURES: Gemma-2's attention soft-capping), by make_engine before anything samples.
"""

from __future__ import annotations

import math

import torch

from thinkrl.errors import UserError
from thinkrl.forward import visit_distributions
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines import Engine, quiet
from thinkrl.rollout.sampling import draw_seeds, processed_logp

PAGE = 64  # tokens per cache page
KV_MARGIN = 256  # the default pool: slots x (longest prompt + this many tokens), whatever the budget

# Model features transformers' paged attention (paged|eager and sdpa, what continuous batching runs) drops
# without a word, so the engine would sample another distribution than the trainer scores: (config attribute,
# the feature). A feature is in use when the model's config sets the attribute to a value other than None.
# attn_logit_softcapping: Gemma-2 caps attention logits at c * tanh(x / c); the paged kernels skip the cap
# (transformers 5.25; tests/test_engine_refusals.py measures the gap this makes).
DROPPED_FEATURES = (("attn_logit_softcapping", "attention logit soft-capping"),)


def dropped_features(model) -> list[str]:
    """The features of `model` (DROPPED_FEATURES) the paged path would drop, each as 'feature (attribute=value)'."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [(attr, what, getattr(config, attr, None)) for attr, what in DROPPED_FEATURES]
    return [f"{what} ({attr}={value})" for attr, what, value in found if value is not None]


class TransformersEngine(Engine):
    name = "transformers"

    def generate(self, model, req: Request) -> Completions:
        from transformers.generation import ContinuousBatchingConfig

        prompts, sampling, pad_id = req.prompts, req.sampling, req.pad_id
        if sampling.min_new_tokens:
            raise UserError(
                "rollout.min_new_tokens is not supported by rollout.engine=transformers (its continuous batching drops "
                "that processor); use rollout.engine=lean or vllm"
            )
        inputs, limits = req.each_completion(), req.limits()
        longest = max(len(p) for p in prompts) + max(limits)
        kv_tokens = int(self.options.get("kv_tokens") or self.slots * (max(len(p) for p in prompts) + KV_MARGIN))
        seed = draw_seeds(req.generator, 1, 2**31 - 1)[0]
        cb = ContinuousBatchingConfig(
            return_logprobs=True,
            page_size=PAGE,
            num_blocks=max(math.ceil(kv_tokens / PAGE), math.ceil(longest / PAGE)),
            max_requests_per_batch=self.slots,
            max_batch_tokens=max(self.slots, 256),
            seed=seed,
        )
        with quiet("transformers.generation.continuous_batching", "ContinuousBatchingLogger"):
            results = _run(model, _config(sampling, pad_id), cb, inputs, limits, list(req.eos_ids) or [-1])
        comp = _completions(results, req.eos_ids, pad_id, next(model.parameters()).device)
        if req.record_topk or req.record_entropy:
            _record(model, inputs, comp, sampling, pad_id, req.record_topk, req.record_entropy)
        self.stats = {}
        return comp


def _config(sampling: Sampling, pad_id: int):
    from transformers.generation import GenerationConfig

    greedy = sampling.temperature == 0
    return GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else sampling.temperature,
        top_p=None if greedy or sampling.top_p >= 1 else sampling.top_p,
        top_k=None if greedy or not sampling.top_k else sampling.top_k,
        pad_token_id=pad_id,
    )


def _run(model, config, cb, inputs: list[list[int]], limits: list[int], eos: list[int]) -> list:
    """Every request through transformers' continuous-batching manager (each with its own budget); the
    finished outputs in request order."""
    with model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=cb, block=True, timeout=5) as m:
        ids = [m.add_request(input_ids=x, max_new_tokens=n, eos_token_id=eos) for x, n in zip(inputs, limits)]
        done: dict = {}
        while len(done) < len(ids):
            result = m.get_result(timeout=1)
            if result is not None and result.is_finished():
                done[result.request_id] = result
            elif result is None and not m.is_running():
                raise RuntimeError("transformers continuous batching stopped before every request finished")
    failed = next((r.error for r in done.values() if r.error), None)
    if failed:
        raise RuntimeError(f"transformers continuous batching failed: {failed}")
    return [done[i] for i in ids]


def _completions(results, eos_ids: list[int], pad_id: int, device) -> Completions:
    R, T = len(results), max((len(r.generated_tokens) for r in results), default=0)
    tokens = torch.full((R, T), pad_id, dtype=torch.long)
    behav = torch.zeros((R, T), dtype=torch.float32)
    lengths = torch.tensor([len(r.generated_tokens) for r in results], dtype=torch.long)
    ended = torch.tensor([bool(r.generated_tokens) and r.generated_tokens[-1] in eos_ids for r in results])
    for i, r in enumerate(results):
        n = len(r.generated_tokens)
        tokens[i, :n] = torch.tensor(r.generated_tokens, dtype=torch.long)
        behav[i, :n] = torch.tensor(r.logprobs[:n], dtype=torch.float32)
    mask = torch.arange(T)[None] < lengths[:, None]
    return Completions(tokens.to(device), behav.to(device), mask.to(device), lengths.to(device), (~ended).to(device))


@torch.no_grad()
def _record(model, prompts: list[list[int]], comp: Completions, sampling: Sampling, pad_id: int, topk: int, entropy: bool) -> None:
    """Top-K and entropy of the processed distribution at every sampled position, from one scoring pass."""
    B, T = comp.tokens.shape
    where = comp.mask.nonzero(as_tuple=True)  # row-major, as visit_distributions walks them
    if topk:
        comp.topk_ids = torch.zeros((B, T, topk), dtype=torch.long, device=comp.tokens.device)
        comp.topk_logp = torch.zeros((B, T, topk), device=comp.tokens.device)
    if entropy:
        comp.entropy = torch.zeros((B, T), device=comp.tokens.device)

    def visit(logits: torch.Tensor, start: int) -> None:
        dist = processed_logp(logits, sampling)  # (n, V)
        at = (where[0][start : start + len(dist)], where[1][start : start + len(dist)])
        if topk:
            top = dist.topk(topk, dim=-1)
            comp.topk_ids[at], comp.topk_logp[at] = top.indices, top.values.clamp(min=-1e4)
        if entropy:
            comp.entropy[at] = -torch.where(dist > -torch.inf, dist.exp() * dist, 0.0).sum(-1)

    visit_distributions(model, prompts, comp.tokens, comp.mask, pad_id, 1.0, visit, raw=True)
