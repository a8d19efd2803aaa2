"""The layouts beyond one GPU, as far as the machine bench/gpu.sh runs on allows (docs/distributed.md):

1. the 7B FSDP2 plan: `thinkrl train --dry-run` for Qwen2.5-7B (its config.json written here from the
   published shape, so no hub is needed), full fine-tune, 8 processes, FSDP2, printed per device;
2. the server layout: `thinkrl serve` (vLLM) and `thinkrl train -o rollout.engine=vllm_server` as two
   processes, 3 grpo steps of the random 1.5B model with LoRA pushed each step (its agreement gap and step
   times), when vLLM is installed; on one GPU the server takes part of it (--gpu-memory-utilization 0.35);
3. FSDP2 for real on 2 GPUs or more: 3 LoRA steps of the random 1.5B model under configs/accelerate/fsdp.yaml;
4. the method matrix on 2 GPUs or more: tests/dist_matrix.py (every shipped config and the full fine-tune,
   reference and batch-statistics cases of tests/test_parallel_matrix.py) on one GPU, then under fsdp.yaml and
   ddp.yaml on two, each case against the one-GPU updates within the bounds dist_matrix.py states.

Each part says "not run" and why when the machine cannot run it. Writes OUT/layouts.md.
`--small`: the same code on a CPU with the tiny test model (the dry run still plans the 7B).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
QWEN_7B = dict(  # Qwen/Qwen2.5-7B's config.json, the fields that size it
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)
STEPS = ["-o", "train.steps=3", "-o", "rollout.prompts_per_step=2", "-o", "rollout.group_size=8", "-o", "verifier.workers=1"]


def thinkrl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "thinkrl", *args], capture_output=True, text=True, env={**os.environ, **(env or {})})


def plan_7b(out: Path, tokenizer: Path) -> str:
    model = out / "qwen2.5-7b-config"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(QWEN_7B))
    for f in tokenizer.iterdir():  # the prompts' lengths only: the plan's KV cache and activations
        shutil.copy(f, model / f.name)
    args = ["--model", str(model), "--processes", "8", "--sharding", "fsdp2", "--device", "cuda", "-o", "model.lora.rank=0"]
    args += ["-o", "rollout.prompts_per_step=16", "-o", "rollout.group_size=8", "-o", "rollout.max_new_tokens=1024"]
    proc = thinkrl("train", "--dry-run", *args)
    return proc.stdout if proc.returncode == 0 else f"failed: {proc.stderr[-2000:]}"


def steps_summary(run: Path) -> str:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keys = ("step", "time/step", "time/generate", "time/update", "mismatch/agreement_gap", "rollout/policy_version")
    return "\n".join(json.dumps({k: m[k] for k in keys if k in m}) for m in lines)


def server_layout(out: Path, model: str, small: bool) -> str:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "not run: vLLM is not installed here"
    run, url = out / "server-run", "http://127.0.0.1:8011"
    common = ["--model", model, "-o", f"rollout.server_url={url}", "-o", f"rollout.max_new_tokens={8 if small else 512}"]
    memory = [] if small else ["-o", "rollout.vllm.memory=0.35"]
    server = subprocess.Popen([sys.executable, "-m", "thinkrl", "serve", *common, *memory], start_new_session=True)
    try:
        for _ in range(300):  # the engine start: about 25 s on a CPU, longer for a first CUDA graph capture
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        proc = thinkrl("train", *common, "-O", str(run), "-o", "rollout.engine=vllm_server", *STEPS)
        return steps_summary(run) if proc.returncode == 0 else f"failed: {proc.stderr[-2000:]}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def fsdp_layout(out: Path, model: str, small: bool) -> str:
    gpus = torch.cuda.device_count()
    if gpus < 2 and not small:
        return f"not run: {gpus} GPU here, FSDP2 needs 2 or more"
    n = 2 if small else gpus
    run = out / "fsdp-run"
    config = str(HERE.parent / "configs/accelerate/fsdp.yaml")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--num_processes", str(n)]
    args = ["train", "--model", model, "-O", str(run), *STEPS, "-o", f"rollout.prompts_per_step={2 * n}"]
    args += ["-o", f"rollout.max_new_tokens={8 if small else 512}"]
    proc = subprocess.run([*cmd, "-m", "thinkrl", *args], capture_output=True, text=True)
    return steps_summary(run) if proc.returncode == 0 else f"failed: {proc.stderr[-2000:]}"


def method_matrix(out: Path, small: bool) -> str:
    gpus = torch.cuda.device_count()
    if gpus < 2 and not small:
        return f"not run: {gpus} GPU here, the matrix needs 2"
    tests = HERE.parent / "tests"
    sys.path.insert(0, str(tests))
    from dist_matrix import CASES, mismatches
    from tiny import build_tiny_model

    model = str(build_tiny_model(out / "tiny-matrix"))
    script = [str(tests / "dist_matrix.py"), model]
    env = {**os.environ, "PYTHONPATH": f"{tests}:{os.environ.get('PYTHONPATH', '')}", "CUDA_VISIBLE_DEVICES": "0" if gpus else ""}
    proc = subprocess.run([sys.executable, *script, str(out / "one.pt"), *CASES], capture_output=True, text=True, env=env)
    if proc.returncode:
        return f"one process failed: {proc.stderr[-2000:]}"
    one, lines = torch.load(out / "one.pt"), []
    for layout in ("fsdp", "ddp"):
        config = str(HERE.parent / f"configs/accelerate/{layout}.yaml")
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--num_processes", "2"]
        env = {**env, "CUDA_VISIBLE_DEVICES": "0,1" if gpus else ""}
        proc = subprocess.run([*cmd, *script, str(out / f"{layout}.pt"), *CASES], capture_output=True, text=True, env=env)
        if proc.returncode:
            lines.append(f"{layout}: failed: {proc.stderr[-2000:]}")
            continue
        two = torch.load(out / f"{layout}.pt")
        bad = {case: found for case in CASES if (found := mismatches(one, two, case))}
        lines.append(f"{layout} ({two['type']}, {two['world']} processes): {len(CASES) - len(bad)} of {len(CASES)} equal one process's")
        lines += [f"  {case}: {'; '.join(found)}" for case, found in bad.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", action="store_true", help="CPU smoke run with the tiny test model")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE))
    if a.small:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from tiny import build_tiny_model

        model = str(build_tiny_model(a.out / "tiny", heads=2, head_dim=32))  # a head size vLLM on a CPU takes
    else:
        from random_model import NAME, model_dir

        model = model_dir(NAME)
    tokenizer = Path(os.environ.get("THINKRL_TOKENIZER_DIR") or model)
    tokenizer = tokenizer if (tokenizer / "tokenizer_config.json").is_file() else Path(model)
    tok_files = a.out / "tokenizer"
    tok_files.mkdir(exist_ok=True)
    for f in tokenizer.glob("*token*"):
        shutil.copy(f, tok_files / f.name)
    parts = {
        "7B full fine-tune, 8 processes, FSDP2 (dry run)": plan_7b(a.out, tok_files),
        "server layout: vLLM server + trainer, 3 steps": server_layout(a.out, model, a.small),
        "FSDP2 over the GPUs, 3 LoRA steps": fsdp_layout(a.out, model, a.small),
        "the method matrix: one GPU against fsdp.yaml and ddp.yaml on two": method_matrix(a.out, a.small),
    }
    text = "\n".join(f"## {name}\n\n```\n{body.strip()}\n```\n" for name, body in parts.items())
    (a.out / "layouts.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
