"""The LoRA adapters a vLLM server samples with: written as PEFT files, loaded under a versioned name, one at a time.

vLLM's runtime adapter loading (POST /v1/load_lora_adapter, /v1/unload_lora_adapter; the server needs
--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, which `thinkrl serve` sets) reads an adapter from a
directory, so the server must see the trainer's files: a temporary directory on this machine (the server runs on
the same machine for now). Each adapter is named `policy-v{N}`, N the number of training steps behind its weights,
and every completion asks for it by that name, so the version a completion was sampled with is the one asked for
(vllm_server.py checks the name the server answers with). The adapters of an earlier trainer process (before a
--resume) are unloaded at the first push: a version number may then stand for other weights.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from thinkrl.errors import UserError
from thinkrl.rollout.engines.server_http import ServerClient, ServerRefused


def peft_names(adapters: dict[str, Tensor], adapter: str) -> dict[str, Tensor]:
    """The trainer's LoRA weights under the names PEFT files use (without the adapter's name), contiguous on the CPU.
    Anything but lora_A / lora_B weights cannot be sent to the server: refused in one line."""
    out = {}
    for name, t in adapters.items():
        if ".lora_A." not in name and ".lora_B." not in name:
            raise UserError(
                f"rollout.engine=vllm_server sends LoRA adapters only, and {name} is trained too; train LoRA weights only "
                "(model.lora.*) or use rollout.engine=vllm"
            )
        out[name.replace(f".{adapter}.weight", ".weight")] = t.detach().to("cpu").contiguous()
    return out


def fingerprint(adapters: dict[str, Tensor]) -> str:
    """A hash of the weights by name: equal weights, equal fingerprint (a version pushed again is not reloaded)."""
    h = hashlib.sha1()
    for name in sorted(adapters):
        t = adapters[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class AdapterPush:
    """Loads adapters into one server and keeps only the newest loaded. `prefix` names this trainer's adapters
    (with several trainer processes each rank has its own); `peft_config` is the policy's peft LoraConfig."""

    def __init__(self, client: ServerClient, peft_config, adapter: str = "default", prefix: str = "policy-v") -> None:
        self.client, self.peft_config, self.adapter, self.prefix = client, peft_config, adapter, prefix
        self.dir = Path(tempfile.mkdtemp(prefix="thinkrl-adapters-"))
        self.loaded: dict[str, tuple[str, Path]] = {}  # name -> (fingerprint, directory) of what the server holds
        self.pushes = 0
        self._cleared = False

    def name(self, version: int) -> str:
        return f"{self.prefix}{version}"

    def push(self, version: int, adapters: dict[str, Tensor]) -> str:
        """Make the server hold `adapters` as version `version` (loading them unless it holds exactly these) and
        unload the others; returns the adapter's name, what completions ask for."""
        if not self._cleared:
            self._unload_leftovers()
            self._cleared = True
        name, weights = self.name(version), peft_names(adapters, self.adapter)
        mark = fingerprint(weights)
        if name in self.loaded and self.loaded[name][0] == mark:
            return name
        self.pushes += 1
        path = self.dir / f"{name}-{self.pushes}"  # a fresh directory: vLLM may skip a reload from a path it has seen
        self._write(path, weights)
        body = {"lora_name": name, "lora_path": str(path), "load_inplace": name in self.loaded}
        try:
            self.client.post("/v1/load_lora_adapter", body, f"loading adapter {name}")
        except ServerRefused as e:
            raise UserError(
                f"{e}; start the server with `thinkrl serve` (it passes --enable-lora, --max-lora-rank at least model.lora.rank "
                "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), and run it on this machine: it reads the adapter from "
                f"{self.dir}"
            ) from None
        if name in self.loaded:
            shutil.rmtree(self.loaded[name][1], ignore_errors=True)
        self.loaded[name] = (mark, path)
        for old in [n for n in self.loaded if n != name]:
            self._unload(old)
        return name

    def _write(self, path: Path, weights: dict[str, Tensor]) -> None:
        from safetensors.torch import save_file

        path.mkdir(parents=True)
        self.peft_config.save_pretrained(str(path))  # adapter_config.json: rank, alpha, targets, rslora
        save_file(weights, str(path / "adapter_model.safetensors"))

    def _unload(self, name: str) -> None:
        self.client.post("/v1/unload_lora_adapter", {"lora_name": name}, f"unloading adapter {name}")
        shutil.rmtree(self.loaded.pop(name)[1], ignore_errors=True)

    def _unload_leftovers(self) -> None:
        """Unload this prefix's adapters an earlier trainer process left on the server (a --resume after a crash)."""
        models = self.client.get("/v1/models", "listing the server's adapters")
        for entry in models.get("data", []) if isinstance(models, dict) else []:
            name = str(entry.get("id", ""))
            if entry.get("parent") is not None and name.startswith(self.prefix) and name[len(self.prefix) :].isdigit():
                self.client.post("/v1/unload_lora_adapter", {"lora_name": name}, f"unloading the earlier run's adapter {name}")

    def close(self) -> None:
        """Forget the files (the server keeps what it loaded until it is asked to unload or stops)."""
        shutil.rmtree(self.dir, ignore_errors=True)
