"""bench_trl.py's two workers, each run in its own subprocess (`bench_trl.py --worker thinkrl|trl`) so that its
peak memory is its own: thinkrl's train loop and TRL's GRPOTrainer at the settings the driver passes."""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_thinkrl(a) -> dict:
    from thinkrl.run.jsonl import read_jsonl
    from thinkrl.settings import load_config
    from thinkrl.train import train

    out = Path(tempfile.mkdtemp(prefix="bench-thinkrl-"))
    overrides = [
        f"train.steps={a.warmup + a.steps}",
        f"rollout.prompts_per_step={a.prompts}",
        f"rollout.group_size={a.group}",
        f"rollout.max_new_tokens={a.max_new_tokens}",
        "train.lr=1e-4",
        "log.rollouts_every=0",
        f"output_dir={out}",
        f"train.micro_batch_size={a.micro_batch}",
        f"train.gradient_checkpointing={a.checkpointing}",  # auto (thinkrl's default) unless --checkpointing says otherwise
    ]
    if not a.variable_length:
        overrides.append(f"rollout.min_new_tokens={a.max_new_tokens}")
    train(load_config(None, overrides, **{"model.name": a.model}))
    steps = read_jsonl(out / "metrics.jsonl")[a.warmup :]
    return {
        "step_s": [m["time/step"] for m in steps],
        "generate_s": [m["time/generate"] for m in steps],
        "score_s": [m["time/score"] for m in steps],
        "update_s": [m["time/update"] for m in steps],
        "tokens": [m["length/mean"] * a.prompts * a.group for m in steps],
        "peak_mb": peak_memory_mb(),
        "children_peak_mb": verifier_worker_mb(),
    }


def verifier_worker_mb() -> float:
    """Peak RSS of one grading worker after real grading (VmHWM from /proc). RUSAGE_CHILDREN is no use here:
    it also counts fork+exec children, which briefly carry the parent's resident pages."""
    from thinkrl.verifier import VerifierPool

    with VerifierPool(1, 5.0) as pool:
        pool.grade([f"So the sum is \\boxed{{{i}}}." for i in range(200)], [str(i) for i in range(200)])
        pid = pool.pids[0]
        hwm = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM")]
    return int(hwm[0].split()[1]) / 1024 if hwm else float("nan")


def run_trl(a) -> dict:
    import torch
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from thinkrl.config import ArithConfig, PromptConfig
    from thinkrl.data.arith import arith_problems
    from thinkrl.models import load_tokenizer, resolve_path
    from thinkrl.verifier import score

    path = resolve_path(a.model)
    tok = load_tokenizer(path)
    instruction = PromptConfig().instruction
    rows = [
        {"prompt": [{"role": "user", "content": instruction.replace("{problem}", p.problem)}], "answer": p.answer}
        for p in arith_problems(ArithConfig(), "train")[:2000]
    ]
    timings = {"generate": 0.0, "score": 0.0}

    generate = transformers.GenerationMixin.generate

    def timed_generate(self, *args, **kw):  # TRL decodes through transformers' generate without vLLM
        t = time.perf_counter()
        try:
            return generate(self, *args, **kw)
        finally:
            timings["generate"] += time.perf_counter() - t

    transformers.GenerationMixin.generate = timed_generate

    def accuracy(completions, answer, **_):
        t = time.perf_counter()
        out = [score(c[0]["content"], gold) for c, gold in zip(completions, answer)]
        timings["score"] += time.perf_counter() - t
        return out

    record: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timings.update(generate=0.0, score=0.0, start=time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            record.append(
                {"step_s": time.perf_counter() - timings["start"], "generate_s": timings["generate"], "score_s": timings["score"]}
            )

    gen_kwargs = {} if a.variable_length else {"min_new_tokens": a.max_new_tokens}
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        per_device_train_batch_size=a.prompts * a.group,
        num_generations=a.group,
        max_completion_length=a.max_new_tokens,
        generation_kwargs=gen_kwargs,
        learning_rate=1e-4,
        max_steps=a.warmup + a.steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        temperature=1.0,
        seed=0,
        beta=0.0,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        gradient_accumulation_steps=1,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=accuracy,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[Clock()],
    )
    trainer.train()
    steps = record[a.warmup :]
    return {
        "step_s": [s["step_s"] for s in steps],
        "generate_s": [s["generate_s"] for s in steps],
        "score_s": [s["score_s"] for s in steps],
        "update_s": [s["step_s"] - s["generate_s"] - s["score_s"] for s in steps],
        "tokens": [a.prompts * a.group * a.max_new_tokens for _ in steps] if not a.variable_length else [float("nan") for _ in steps],
        "peak_mb": peak_memory_mb(),
        "children_peak_mb": 0.0,
    }
