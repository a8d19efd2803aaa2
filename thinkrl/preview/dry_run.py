"""`thinkrl train --dry-run`: what a run would do and how much memory its steps need, without loading weights
or writing a run directory. The config is resolved as the run resolves it; the prompts are built as the run
builds them (their lengths size the key/value cache); the model is built on the meta device from its
config.json, with the LoRA adapters and the sampling copy the run would make, so the engine's decoder path
and every parameter count come from the same code a run uses. The memory arithmetic is memory.py's for one
process and layout.py's per device for several (--processes, --sharding, --server-devices, --device).
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import replace

import torch

from thinkrl.accel.packed import can_pack
from thinkrl.config import Config
from thinkrl.data import model_context
from thinkrl.errors import UserError
from thinkrl.models import BUNDLED, add_lora, bundled_path, cache_dir, load_tokenizer, resolve_dtype, resolve_path
from thinkrl.preview import layout as placing
from thinkrl.preview import memory
from thinkrl.preview.layout import Layout
from thinkrl.rollout.engines import describe_path, make_engine
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.settings import resolve_with_method
from thinkrl.setup import prepare_data


def dry_run(cfg: Config, layout: Layout | None = None) -> None:
    """Print the run's sampling path and its memory estimate by part; load no weights, write nothing. With a
    layout of several devices (preview/layout.py), the estimate is per trainer device and per server device."""
    layout = layout or Layout()
    cfg, method = resolve_with_method(cfg)
    device = plan_device(layout.device)
    rc, fsdp2 = cfg.rollout, layout.sharding == "fsdp2"
    print(
        f"dry run: model {cfg.model.name}, method {cfg.method.name}, {rc.prompts_per_step} prompts x {rc.group_size}, "
        f"up to {rc.max_new_tokens} new tokens, on {device.type}"
    )
    placing.check_config(layout, cfg)
    config, tok = model_files(cfg.model.name)
    prompts, _ = prepare_data(cfg, tok, model_context(config, tok))  # the run's checks, and its "data:" line
    dtype = resolve_dtype(cfg.model.dtype, device)
    policy, sampling = meta_models(cfg, config, dtype, copy_always=fsdp2)  # setup.py: under FSDP it samples with a copy
    colocated = False
    if layout.server_devices:
        print(f"sampling: a vLLM server on {layout.server_devices} devices (tensor parallel), sent the weights after each update")
        fused = False
    else:
        engine = make_engine(rc.engine, device, rc.batch_size, rc.max_new_tokens, model=sampling, precision=rc.precision)  # as setup.py
        path = describe_path(engine, sampling)
        print(f"sampling: {path.line()}")
        fused = path.decoder == "fused decoder"
        colocated = path.engine == "vllm"
    shape = model_shape(config, policy, sampling)
    longest = max(len(p.ids) for p in prompts)
    baseline = memory.BASELINE_CPU if device.type == "cpu" else memory.BASELINE_CUDA
    reserve = vllm_reserve(cfg, device) if colocated else 0
    if layout.single:
        plan = replace(run_plan(cfg, method, device, dtype, sampling, policy, longest, fused), vllm_reserve=reserve)
        print(memory.report(memory.parts(shape, plan, baseline), device.type))
    else:
        n = layout.processes
        share = replace(cfg, rollout=replace(rc, prompts_per_step=rc.prompts_per_step // n))  # each rank's prompts
        plan = replace(run_plan(share, method, device, dtype, sampling, policy, longest, fused), vllm_reserve=reserve)
        if fsdp2:  # train.py turns the CPU speed-ups off under FSDP: they repack whole weights
            plan = replace(plan, packs=False, packs_copy=False)
        print(f"layout: {layout.line()}; {rc.prompts_per_step // n} prompts x {rc.group_size} per process")
        shards = placing.sharded(policy, n) if fsdp2 else None
        print(memory.report(placing.trainer_parts(shape, plan, layout, shards, baseline), device.type, f"per trainer device (x{n})"))
        if layout.server_devices:
            slots = min(rc.batch_size, rc.prompts_per_step * rc.group_size)  # the server decodes every rank's completions
            parts = placing.server_parts(shape, plan, layout, slots)
            print(memory.report(parts, device.type, f"per server device (x{layout.server_devices}; vLLM's workspace not counted)"))
    print("dry run: no weights loaded, no run directory written")


def vllm_reserve(cfg: Config, device: torch.device) -> int:
    """Bytes an in-process vLLM reserves on CUDA: rollout.vllm.memory (0: 0.3, engines/vllm.py) of this device, or
    of memory.ASSUMED_DEVICE when the plan is made without a GPU (on a CPU its share is of RAM: left out)."""
    if device.type != "cuda":
        return 0
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else memory.ASSUMED_DEVICE
    return int((cfg.rollout.vllm.memory or 0.3) * total)


def plan_device(asked: str) -> torch.device:
    """The device the estimate is for: --device cuda plans a GPU run on any machine (bfloat16 weights, GPU
    memory); auto is what Accelerate gives a single process here."""
    if asked == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(asked)


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


def meta_models(cfg: Config, config, dtype: torch.dtype, copy_always: bool = False):
    """The policy (LoRA-wrapped, masters and compute dtype `dtype` as models.load_policy makes it) and the model its rollouts sample with
    (policy_copy.PolicySampler; `copy_always` as setup.py passes it), on the meta device: shapes and dtypes
    without any memory."""
    from transformers import AutoModelForCausalLM

    full = cfg.model.lora.rank == 0
    master = dtype if cfg.model.master_dtype == "same" else torch.float32  # models.master_dtype, for `dtype` computing
    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(config, dtype=master if full else dtype)
        if not full:
            policy = add_lora(policy, cfg.model.lora, float32_adapters=cfg.model.master_dtype == "float32")
        policy.__dict__["thinkrl_compute_dtype"] = dtype  # as load_policy marks it: the sampler copies to it
        sampler = PolicySampler(policy, cfg.rollout.precision, cfg.rollout.staleness, copy_always=cfg.seeds.enabled or copy_always)
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
        vllm_sleeps=rc.vllm.sleep,
    )
