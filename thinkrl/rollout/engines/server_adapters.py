"""The LoRA adapters a vLLM server samples with: written as PEFT files, loaded under a versioned name, one at a time.

vLLM's runtime adapter loading (POST /v1/load_lora_adapter, /v1/unload_lora_adapter; the server needs
--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, which `thinkrl serve` sets) reads an adapter from a
directory, so the server must see the trainer's files: rollout.adapter_dir, a filesystem both share (empty: a
temporary directory, which a server on this machine sees). Each file set ends with a marker written last, so a
reader that waits for it never takes a half-written adapter. Each adapter is named `policy-{run}-v{N}`: `run`
tells this run's adapters from another's on a shared server (a hash of the host and run directory, the same
after a --resume), N is the number of training steps behind its weights. The adapters of an earlier trainer
process of this run (before a --resume) are unloaded at the first push: a version number may then stand for
other weights; another run's adapters are left alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from thinkrl.errors import UserError
from thinkrl.rollout.engines.server_http import ServerClient, ServerRefused

MARKER = "COMPLETE"  # written after the adapter's files: its presence says they are whole


def run_tag(run_dir: str | Path) -> str:
    """Eight hex digits naming a run on a shared server: its host and absolute run directory, so a resumed run
    keeps its name and two runs (on one machine or two) never share one."""
    where = f"{socket.gethostname()}:{Path(run_dir).resolve()}"
    return hashlib.sha1(where.encode()).hexdigest()[:8]


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
    """Loads one run's adapters into one server and keeps only the newest loaded (one process per run pushes: rank
    0). `run` names the run (run_tag); `root` is rollout.adapter_dir (empty: a temporary directory); `peft_config`
    is the policy's peft LoraConfig."""

    def __init__(self, client: ServerClient, peft_config, adapter: str = "default", run: str = "", root: str = "") -> None:
        self.client, self.peft_config, self.adapter = client, peft_config, adapter
        self.prefix = f"policy-{run}-v" if run else "policy-v"
        if root:  # this run's own folder under the shared directory: what is in it is only ever this run's
            self.dir = Path(root).expanduser().resolve() / f"thinkrl-{run or 'run'}"
            shutil.rmtree(self.dir, ignore_errors=True)  # an earlier process's files, whose adapters are unloaded below
            try:
                self.dir.mkdir(parents=True)
            except OSError as e:
                raise UserError(
                    f"rollout.adapter_dir={root}: cannot create {self.dir} ({e.strerror}); set it to a directory this "
                    "trainer can write and the server can read"
                ) from None
        else:
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
                "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), and let it read the adapter at "
                f"{path}: run it on this machine or set rollout.adapter_dir to a directory both see"
            ) from None
        if name in self.loaded:
            shutil.rmtree(self.loaded[name][1], ignore_errors=True)
        self.loaded[name] = (mark, path)
        for old in [n for n in self.loaded if n != name]:
            self._unload(old)
        return name

    def _write(self, path: Path, weights: dict[str, Tensor]) -> None:
        """The PEFT files, flushed to disk, then the marker: on a shared filesystem the server may look before the
        last byte lands, and a reader that waits for the marker never loads half an adapter."""
        from safetensors.torch import save_file

        path.mkdir(parents=True)
        self.peft_config.save_pretrained(str(path))  # adapter_config.json: rank, alpha, targets, rslora
        save_file(weights, str(path / "adapter_model.safetensors"))
        for written in path.iterdir():
            with open(written, "rb") as f:
                os.fsync(f.fileno())
        (path / MARKER).write_text(f"{len(weights)} tensors\n")

    def _unload(self, name: str) -> None:
        self.client.post("/v1/unload_lora_adapter", {"lora_name": name}, f"unloading adapter {name}")
        shutil.rmtree(self.loaded.pop(name)[1], ignore_errors=True)

    def _unload_leftovers(self) -> None:
        """Unload the adapters an earlier trainer process of this run left on the server (a --resume after a crash);
        other runs' adapters have another prefix and stay."""
        models = self.client.get("/v1/models", "listing the server's adapters")
        for entry in models.get("data", []) if isinstance(models, dict) else []:
            name = str(entry.get("id", ""))
            if entry.get("parent") is not None and name.startswith(self.prefix) and name[len(self.prefix) :].isdigit():
                self.client.post("/v1/unload_lora_adapter", {"lora_name": name}, f"unloading the earlier process's adapter {name}")

    def close(self) -> None:
        """Forget the files (the server keeps what it loaded until it is asked to unload or stops)."""
        shutil.rmtree(self.dir, ignore_errors=True)
