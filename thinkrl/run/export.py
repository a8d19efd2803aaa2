"""`thinkrl export RUN_DIR[/checkpoints/step-N] --out DIR [--merge]`: a checkpoint in the formats other tools load.

Without --merge a LoRA run exports its peft adapter (adapter_config.json + adapter_model.safetensors) with
the tokenizer: `PeftModel.from_pretrained(base, DIR)`. With --merge the adapter is folded into the base
weights and DIR is a plain transformers model (safetensors, config, tokenizer and chat template), which
`AutoModelForCausalLM.from_pretrained(DIR)` and vLLM load directly. A full fine-tuning checkpoint is
already a plain model and is exported as such either way. A run on the bundled alias (smollm2-135m) names its
hub id as the base model, not this machine's converted copy, so the export loads elsewhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from thinkrl.config.load import load_config
from thinkrl.errors import UserError
from thinkrl.models import BUNDLED_HUB_IDS, load_base, load_tokenizer, resolve_path
from thinkrl.run.console import console
from thinkrl.run.intact import find_checkpoint


def export(source: Path, out: Path, merge: bool = False, dtype: str = "float32") -> Path:
    found = find_checkpoint(str(source))
    if found is None:
        raise UserError(f"{source}: not a run directory (no config.yaml) or one of its checkpoints (RUN_DIR/checkpoints/step-N)")
    run_dir, ckpt = found
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():  # mkdir / copytree would fail with a traceback
        where = "it" if existing == out else existing
        raise UserError(f"--out {out}: {where} is a file; name a new directory (the export writes several files into it)")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} exists and is not empty; pick a new directory")
    cfg = load_config(run_dir / "config.yaml")
    if not (ckpt / "adapter").is_dir():  # full fine-tuning: the checkpoint holds a complete model already
        shutil.copytree(ckpt / "model", out, dirs_exist_ok=True)
        console.print(f"exported the full model of {ckpt} to {out}")
        return out
    tok = load_tokenizer(resolve_path(cfg.model.name))
    out.mkdir(parents=True, exist_ok=True)
    if merge:
        from peft import PeftModel

        model, _ = load_base(cfg.model.name, getattr(torch, dtype))
        merged = PeftModel.from_pretrained(model, ckpt / "adapter").merge_and_unload()
        merged.save_pretrained(out)
        what = "merged model"
    else:
        shutil.copytree(ckpt / "adapter", out, dirs_exist_ok=True)
        _name_hub_base(out / "adapter_config.json", cfg.model.name)
        what = "LoRA adapter"
    tok.save_pretrained(out)  # with its chat template, so chat-formatted prompts match training
    console.print(f"exported the {what} of {ckpt} to {out}")
    return out


def _name_hub_base(adapter_config: Path, model: str) -> None:
    """The bundled alias trained from a converted copy in this machine's cache: name its hub id instead."""
    hub_id = BUNDLED_HUB_IDS.get(model)
    if hub_id is not None:
        settings = json.loads(adapter_config.read_text())
        settings["base_model_name_or_path"] = hub_id
        adapter_config.write_text(json.dumps(settings, indent=2) + "\n")
