"""`thinkrl train --dry-run`: what a run would do and how much memory its steps need, without loading weights
or writing a run directory. The config is resolved as the run resolves it; the prompts are built as the run
builds them (their lengths size the key/value cache); the model is built on the meta device from its
config.json, with the LoRA adapters and the sampling copy the run would make, so the engine's decoder path
and every parameter count come from the same code a run uses. The memory arithmetic is memory.py's.
"""

from __future__ import annotations

import importlib.util
from collections import Counter

import torch

from thinkrl.accel.packed import can_pack
from thinkrl.config import Config
from thinkrl.data import model_context
from thinkrl.errors import UserError
from thinkrl.models import BUNDLED, add_lora, bundled_path, cache_dir, load_tokenizer, resolve_dtype, resolve_path
from thinkrl.preview import memory
from thinkrl.rollout.engines import describe_path, make_engine
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.settings import resolve_with_method
from thinkrl.setup import prepare_data


def dry_run(cfg: Config) -> None:
    """Print the run's sampling path and its memory estimate by part; load no weights, write nothing."""
    cfg, method = resolve_with_method(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # what Accelerate gives a single process
    rc = cfg.rollout
    print(
        f"dry run: model {cfg.model.name}, method {cfg.method.name}, {rc.prompts_per_step} prompts x {rc.group_size}, "
        f"up to {rc.max_new_tokens} new tokens, on {device.type}"
    )
    config, tok = model_files(cfg.model.name)
    prompts, _ = prepare_data(cfg, tok, model_context(config, tok))  # the run's checks, and its "data:" line
    dtype = resolve_dtype(cfg.model.dtype, device)
    policy, sampling = meta_models(cfg, config, dtype)
    engine = make_engine(rc.engine, device, rc.batch_size, rc.max_new_tokens, model=sampling, precision=rc.precision)  # as setup.py
    path = describe_path(engine, sampling)
    print(f"sampling: {path.line()}")
    shape = model_shape(config, policy, sampling)
    plan = run_plan(cfg, method, device, dtype, sampling, policy, max(len(p.ids) for p in prompts), path.decoder == "fused decoder")
    baseline = memory.BASELINE_CPU if device.type == "cpu" else memory.BASELINE_CUDA
    print(memory.report(memory.parts(shape, plan, baseline), device.type))
    print("dry run: no weights loaded, no run directory written")


def model_files(name: str):
    """The model's transformers config and its tokenizer, without its weights. The bundled alias not yet
    converted (models.bundled_path) is read from its GGUF file's metadata: converting would load the weights."""
    from transformers import AutoConfig, AutoTokenizer

    converted = cache_dir() / "models" / name / "config.json"
    if name in BUNDLED and not converted.is_file():
        package, filename = BUNDLED[name]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None or importlib.util.find_spec("gguf") is None:
            bundled_path(name)  # raises the install hint before anything loads
        source = str(importlib.util.find_spec(package).origin).rsplit("/", 1)[0]  # type: ignore[union-attr]
        config = AutoConfig.from_pretrained(source, gguf_file=filename)
        tok = AutoTokenizer.from_pretrained(source, gguf_file=filename)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return config, tok
    path = resolve_path(name)
    tok = load_tokenizer(path)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # an unknown architecture, an unreachable hub
        raise UserError(f"could not read the config of model {name}: {str(e).strip().splitlines()[0][:300]}") from e
    return config, tok


def meta_models(cfg: Config, config, dtype: torch.dtype):
    """The policy (LoRA-wrapped as models.load_policy makes it) and the model its rollouts sample with
    (policy_copy.PolicySampler), on the meta device: shapes and dtypes without any memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if cfg.model.lora.rank > 0:
            policy = add_lora(policy, cfg.model.lora)
        sampler = PolicySampler(policy, cfg.rollout.precision, cfg.rollout.staleness, copy_always=cfg.seeds.enabled)
    return policy, sampler.model


def model_shape(config, policy, sampling) -> memory.ModelShape:
    """Parameter counts of the meta models: what memory.parts multiplies by element sizes."""
    own, trained = sampling is policy, [p for p in policy.parameters() if p.requires_grad]
    lora = Counter()
    if hasattr(policy, "peft_config"):
        from peft.tuners.lora import Linear as LoraLinear

        for m in policy.modules():
            if type(m) is LoraLinear and type(m.base_layer) is torch.nn.Linear and not m.base_layer.weight.requires_grad:
                lora[(m.in_features, m.out_features)] += 1
    return memory.ModelShape(
        config=config,
        params=sum(p.numel() for p in policy.parameters()),
        trainable=sum(p.numel() for p in trained),
        trainable_bytes=trained[0].element_size() if trained else 4,  # peft keeps adapters in float32 over a bfloat16 base
        copy_params=0 if own else sum(p.numel() for p in sampling.parameters()),
        copy_linear=0 if own else _linear(sampling, frozen_only=False),
        frozen_linear=_linear(policy, frozen_only=True),
        lora_shapes=lora,
    )


def _linear(model, frozen_only: bool) -> int:
    """Elements of model's plain nn.Linear weights, the output head included: what accel/packed.py packs (the
    sampling copy's for a generation; with frozen_only, the policy's frozen LoRA bases and head for the update;
    the adapters are trainable and never packed)."""
    return sum(m.weight.numel() for m in model.modules() if type(m) is torch.nn.Linear and not (frozen_only and m.weight.requires_grad))


def run_plan(cfg: Config, method, device, dtype, sampling, policy, prompt_tokens: int, fused: bool) -> memory.Plan:
    """What the run does that sizes its memory: batch cuts (learner/batching.py), slots, packing, copies."""
    rc, tc = cfg.rollout, cfg.train
    rows = rc.prompts_per_step * rc.group_size
    mini = -(-rows // tc.mini_batches)
    T = rc.max_new_tokens  # fixed-length worst case: every completion uses the whole budget
    by_tokens = max(1, tc.micro_batch_tokens // T) if tc.micro_batch_tokens else mini
    per_pass = mini if method.batch_statistics else min(tc.micro_batch_size, mini, by_tokens)
    G = rc.group_size
    spans = -(-per_pass // G) + (0 if G % per_pass == 0 or per_pass % G == 0 else 1)  # a pass may straddle two groups
    copy_dtype = next(sampling.parameters()).dtype
    lora = cfg.model.lora.rank > 0
    weight = torch.empty((1, 1), dtype=dtype)
    return memory.Plan(
        device=device.type,
        dtype_bytes=weight.element_size(),
        copy_bytes=torch.empty((), dtype=copy_dtype).element_size(),
        slots=min(rc.batch_size, rows),
        prompt_tokens=prompt_tokens,
        max_new_tokens=T,
        lean=fused,
        packs=device.type == "cpu" and can_pack(weight),
        packs_copy=device.type == "cpu" and can_pack(torch.empty((1, 1), dtype=copy_dtype)),
        rows_per_pass=per_pass,
        prompts_per_pass=min(spans, rc.prompts_per_step, per_pass),
        checkpointing=tc.gradient_checkpointing,
        steps=tc.steps,
        trainable_copies=3 + (1 if lora else 0) + (rc.staleness + 1 if rc.staleness else 0),
        reference="ref_logp" in method.requires and not lora,
    )
