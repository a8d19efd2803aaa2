"""`thinkrl eval`: sample n completions per problem, grade them, report avg@n and pass@k.

Writes OUTPUT/samples.jsonl (one line per completion) and OUTPUT/summary.json (metrics plus every setting
that changes a number). Rerunning into the same OUTPUT resumes: samples already in samples.jsonl are not
generated again, so an interrupted evaluation loses at most one generation batch.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from thinkrl import checkpoint
from thinkrl.config import Config, DataConfig, load_config
from thinkrl.data import build_prompts, load_problems
from thinkrl.errors import UserError
from thinkrl.logs import JsonlLog, console, read_jsonl
from thinkrl.models import load_base, resolve_dtype
from thinkrl.rollout import Sampling, generate
from thinkrl.verifier import VerifierPool


@dataclass
class EvalSettings:
    model: str
    dataset: str
    split: str | None = None
    n: int = 1
    limit: int = 0
    max_new_tokens: int | None = None  # None: the train config's budget on its own dataset, else 512
    temperature: float | None = None  # None: greedy when n == 1, else 0.6
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 64  # completions decoded together
    adapter: str | None = None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def find_checkpoint(model_arg: str) -> tuple[Path, Path] | None:
    """(run_dir, checkpoint) when `model_arg` is a run directory or one of its checkpoints."""
    p = Path(model_arg)
    if (p / "config.yaml").is_file():
        ckpt = checkpoint.latest(p)
        if ckpt is None:
            raise UserError(f"run directory {p} has no complete checkpoint yet")
        return p, ckpt
    if (p / checkpoint.MARKER).is_file() and p.parent.name == "checkpoints":
        return p.parent.parent, p
    return None


def load_for_eval(model_arg: str, adapter: str | None, device: torch.device):
    """Model (adapters merged), tokenizer and the run's config when `model_arg` is a run directory."""
    from peft import PeftModel

    dtype = resolve_dtype("auto", device)
    found, run_cfg = find_checkpoint(model_arg), None
    if found:
        run_dir, ckpt = found
        run_cfg = load_config(run_dir / "config.yaml")
        if (ckpt / "adapter").is_dir():
            model, tok = load_base(run_cfg.model.name, dtype)
            model = PeftModel.from_pretrained(model, ckpt / "adapter").merge_and_unload()
        else:
            model, tok = load_base(str(ckpt / "model"), dtype)
        console.print(f"evaluating {ckpt}")
    else:
        model, tok = load_base(model_arg, dtype)
    if adapter:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model.to(device).eval(), tok, run_cfg


def evaluate(s: EvalSettings, output: Path, cfg: Config | None = None) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tok, run_cfg = load_for_eval(s.model, s.adapter, device)
    cfg = cfg or run_cfg or Config()
    own_dataset = s.dataset in ("", None, cfg.data.name)
    s.dataset = s.dataset or cfg.data.name
    if s.max_new_tokens is None:
        s.max_new_tokens = cfg.rollout.max_new_tokens if own_dataset else 512
    data_cfg = DataConfig(**{**asdict(cfg.data), "name": s.dataset, "limit": s.limit, "arith": cfg.data.arith})
    split = s.split or ("test" if data_cfg.name == "arith" else None)
    loaded = load_problems(data_cfg, split)
    prompts, too_long = build_prompts(loaded.problems, tok, cfg.prompt, max_tokens=10**9)
    temperature = s.temperature if s.temperature is not None else (0.0 if s.n == 1 else 0.6)
    sampling = Sampling(s.max_new_tokens, temperature, s.top_p)
    output.mkdir(parents=True, exist_ok=True)
    samples_log = JsonlLog(output / "samples.jsonl")
    done = {(r["id"], r["sample"]) for r in read_jsonl(samples_log.path)} if samples_log.path.exists() else set()
    todo = [p for p in sorted(prompts, key=lambda p: len(p.ids)) if any((p.id, k) not in done for k in range(s.n))]
    if done:
        console.print(f"resuming: {len(done)} samples already in {samples_log.path}")
    eos = sorted({tok.eos_token_id, *([model.generation_config.eos_token_id] if isinstance(model.generation_config.eos_token_id, int) else model.generation_config.eos_token_id or [])} - {None})
    per_batch = max(1, s.batch_size // s.n)
    t0, new_tokens = time.perf_counter(), 0
    with VerifierPool() as pool:
        from thinkrl.logs import progress

        with progress() as bar:
            task = bar.add_task("eval", total=len(todo) * s.n, info="")
            for b in range(0, len(todo), per_batch):
                chunk = todo[b : b + per_batch]
                gen = torch.Generator(device=device).manual_seed(s.seed * 1_000_003 + b)
                comp = generate(model, [p.ids for p in chunk], s.n, sampling, eos, tok.pad_token_id, gen)
                texts = tok.batch_decode([row[m].tolist() for row, m in zip(comp.tokens, comp.mask)], skip_special_tokens=True)
                scores, extracted, _ = pool.grade(texts, [p.answer for p in chunk for _ in range(s.n)])
                new_tokens += int(comp.lengths.sum())
                records = []
                for i, text in enumerate(texts):
                    p, k = chunk[i // s.n], i % s.n
                    if (p.id, k) in done:
                        continue
                    records.append({"id": p.id, "sample": k, "completion": text, "extracted": extracted[i], "gold": p.answer,
                                    "correct": scores[i] == 1.0, "length": int(comp.lengths[i]), "truncated": bool(comp.truncated[i])})
                samples_log.write(records)
                bar.update(task, advance=len(texts), info=f"{new_tokens / (time.perf_counter() - t0):.0f} tok/s")
    rows = [r for r in read_jsonl(samples_log.path) if r["id"] in {p.id for p in prompts}]
    summary = _summarise(rows, s, temperature, cfg, loaded.skipped, too_long)
    (output / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _summarise(rows: list[dict], s: EvalSettings, temperature: float, cfg: Config, skipped: dict, too_long: int) -> dict:
    by_id: dict[str, list[dict]] = {}
    for r in rows:
        by_id.setdefault(r["id"], []).append(r)
    n = s.n
    metrics = {f"avg@{n}": sum(r["correct"] for r in rows) / max(len(rows), 1)}
    k = 1
    while k <= n:
        metrics[f"pass@{k}"] = sum(pass_at_k(len(v), sum(r["correct"] for r in v), k) for v in by_id.values()) / max(len(by_id), 1)
        k *= 2
    metrics["length/mean"] = sum(r["length"] for r in rows) / max(len(rows), 1)
    metrics["truncated_frac"] = sum(r["truncated"] for r in rows) / max(len(rows), 1)
    return {
        "dataset": s.dataset,
        "problems": len(by_id),
        "samples": len(rows),
        "metrics": metrics,
        "settings": {**asdict(s), "temperature": temperature, "prompt": asdict(cfg.prompt)},
        "skipped": {**skipped, **({"prompt too long": too_long} if too_long else {})},
    }
