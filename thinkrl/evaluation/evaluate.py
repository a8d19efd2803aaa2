"""`thinkrl eval`: sample n completions per problem, grade them, report avg@n, pass@k and maj@n.

Per dataset, OUTPUT holds samples.jsonl (one line per completion), settings.json and summary.json.
A sample that scored 0 says why in samples.jsonl (`zero_reason`: wrong, no answer, truncated, timeout or
crash: the last two, the verifier ran past its time limit or its worker died), and summary.json counts
each (`outcomes`, and the verifier's `timeouts` and `crashes`). A failed write (a file in the way, a
read-only directory, a full disk) stops with one line naming the path and the fix.
Rerunning into the same OUTPUT resumes: samples already in samples.jsonl are not generated again (and a
rerun with different settings is refused; thinkrl/evaluation/settings.py). The metrics are defined in
thinkrl/evaluation/metrics.py.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from thinkrl.config import Config, DataConfig, PromptConfig
from thinkrl.config.load import load_config
from thinkrl.data import Loaded, build_prompts, fit_context, load_problems, model_context
from thinkrl.errors import UserError
from thinkrl.evaluation.metrics import answer_classes, outcomes, summarise, zero_reason
from thinkrl.evaluation.settings import EvalSettings, check_resume, check_sample_count, resolve_settings, versions
from thinkrl.evaluation.writes import check_output, writing
from thinkrl.models import eos_ids, load_base, resolve_dtype, resolve_path
from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import Engine, check_engine, describe_path, make_engine
from thinkrl.run.atomic import write_atomic
from thinkrl.run.checkpoint import checkpoint_step
from thinkrl.run.console import console, progress, shown
from thinkrl.run.intact import find_checkpoint
from thinkrl.run.jsonl import JsonlLog, read_jsonl
from thinkrl.run.lock import DirLock
from thinkrl.verifier import same_answers

CHUNK_SLOTS = 4


def eval_split(s: EvalSettings) -> str | None:
    """--split, else the built-in task's held-out split, else the dataset's own."""
    return s.split or ("test" if s.dataset == "arith" else None)


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
        console.print(f"evaluating {shown(ckpt)}")
    else:
        model, tok = load_base(model_arg, dtype)
    if adapter:
        if not Path(adapter, "adapter_config.json").is_file():
            raise UserError(f"--adapter {adapter}: no adapter_config.json there (expected a peft adapter directory)")
        try:
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        except (RuntimeError, ValueError, KeyError) as e:  # size mismatches, target modules the model lacks
            raise UserError(adapter_mismatch(adapter, model_arg, e)) from e
    return model.to(device).eval().requires_grad_(False), tok, run_cfg  # frozen: generate may take the lean path


def adapter_mismatch(adapter: str, model_arg: str, e: BaseException) -> str:
    """--adapter that does not fit --model: name the base model the adapter was trained on."""
    try:
        base = json.loads(Path(adapter, "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    trained = f"was trained on {base}" if base else "names no base model"
    first = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()[:200]
    return (
        f"--adapter {adapter} does not fit --model {model_arg}: the adapter {trained} ({type(e).__name__}: {first}); "
        "pass that model as --model, or an adapter trained on this one"
    )


def eval_dataset(
    model, tok, s: EvalSettings, data_cfg: DataConfig, out_dir: Path, pool, engine: Engine, run_dir: Path | None = None
) -> dict:
    """Evaluate one dataset into out_dir, holding out_dir's lock (thinkrl/run/lock.py) while writing it: a second
    eval into the same directory fails in one line naming this one, instead of both appending samples. run_dir:
    the training run this evaluation runs in (None: thinkrl eval), for the message of a failed write."""
    loaded = _load(s, data_cfg, "eval.datasets")
    lock = _locked(out_dir, run_dir)
    try:
        return _eval_dataset(model, tok, s, loaded, out_dir, pool, engine, run_dir)
    finally:
        lock.release()


def _locked(out_dir: Path, run_dir: Path | None) -> DirLock:
    """out_dir's lock (thinkrl/run/lock.py), taken; a lock file that cannot be made is one line (writes.py)."""
    lock = DirLock(out_dir, "evaluation", elsewhere="another --output")
    with writing(lock.path, out_dir, run_dir):
        lock.acquire()
    return lock


def _load(s: EvalSettings, data_cfg: DataConfig, flag: str) -> Loaded:
    """The problems of s.dataset; a warning line per doubt about them (a benchmark copy with the wrong row count)."""
    loaded = load_problems(replace(data_cfg, name=s.dataset, limit=s.limit), eval_split(s), flag=flag)
    for line in loaded.warnings:
        console.print(f"[yellow]warning: {shown(line)}[/]", soft_wrap=True)  # one line, however long the path
    return loaded


def _eval_dataset(model, tok, s: EvalSettings, loaded: Loaded, out_dir: Path, pool, engine: Engine, run_dir: Path | None = None) -> dict:
    """Generate with `engine`, grade and summarise one dataset (its `loaded` problems) into out_dir (resuming what
    is already there)."""
    prompt_cfg = PromptConfig(template=s.template, system=s.system, instruction=s.instruction)
    prompts, _ = build_prompts(loaded.problems, tok, prompt_cfg, max_tokens=10**9)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = {**asdict(s), "dataset_source": loaded.origin, "dataset_sha256": loaded.sha256}  # the file read, and its hash
    settings |= {"dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "engine_used": engine.name}
    settings["sampling"] = describe_path(engine, model).record()  # the decoder too: lean may fall back (docs/engines.md)
    check_resume(out_dir, settings)
    with writing(out_dir / "settings.json", out_dir, run_dir):
        write_atomic(out_dir / "settings.json", json.dumps(settings, indent=2))
    log = JsonlLog(out_dir / "samples.jsonl")
    prior = read_jsonl(log.path) if log.path.exists() else []  # a resumed problem's new samples join its answer classes
    done = {(r["id"], r["sample"]) for r in prior}
    context = model_context(model.config, tok) or 10**9
    prompts, too_long = fit_context(prompts, context, room=1)  # no room for a single new token: skipped, counted
    if too_long:
        loaded.skipped["prompt fills the context"] = too_long
        console.print(f"[yellow]warning: {shown(s.dataset)}: {too_long} prompts fill the model's {context}-token context; skipped[/]")
    todo = [p for p in sorted(prompts, key=lambda p: len(p.ids)) if any((p.id, k) not in done for k in range(s.n))]
    eos = eos_ids(model, tok)
    # a call decodes CHUNK_SLOTS x the engine's slots of requests (its slots refill within a call); written per call
    per_batch, clipped, new_tokens, correct, graded = max(1, CHUNK_SLOTS * s.batch_size // s.n), 0, 0, 0, 0
    t0 = time.perf_counter()
    with progress() as bar:
        task = bar.add_task(shown(s.dataset), total=len(todo) * s.n, info="")
        for b in range(0, len(todo), per_batch):
            chunk = todo[b : b + per_batch]
            own = [min(s.max_new_tokens, context - len(p.ids)) for p in chunk]  # only a prompt that needs it is clipped
            clipped += sum(n < s.max_new_tokens for n in own)
            gen = torch.Generator(device=model.device).manual_seed(s.seed * 1_000_003 + b)
            sampling = Sampling(max(own), s.temperature, s.top_p)
            budgets = [n for n in own for _ in range(s.n)]
            comp = engine.generate(model, Request([p.ids for p in chunk], s.n, sampling, eos, tok.pad_token_id, gen, budgets=budgets))
            texts = tok.batch_decode([row[m].tolist() for row, m in zip(comp.tokens, comp.mask)], skip_special_tokens=True)
            scores, extracted, _ = pool.grade(texts, [p.answer for p in chunk for _ in range(s.n)])
            failures = dict(getattr(pool, "last_failures", {}))  # sample -> "timeout" / "crash"
            records = _sample_records(chunk, s.n, texts, scores, extracted, comp, failures, done)
            answer_classes(records, prior, lambda pairs: same_answers(pool, pairs))  # maj@n's votes, in the pool
            with writing(log.path, out_dir, run_dir):
                log.write(records)
            new_tokens += int(comp.lengths.sum())
            correct, graded = correct + sum(r["correct"] for r in records), graded + len(records)
            info = f"acc {correct / max(graded, 1):.3f}  {new_tokens / (time.perf_counter() - t0):.0f} tok/s"
            bar.update(task, advance=len(texts), info=info)
    return _summarise(
        s, prompts, log, out_dir, run_dir, {**settings, "context_window": context, "clipped_prompts": clipped}, loaded.skipped
    )


def _sample_records(chunk: list, n: int, texts: list[str], scores, extracted, comp, failures: dict, done: set) -> list[dict]:
    """samples.jsonl's lines for one generated chunk (n samples per prompt), less those already written."""
    records = []
    for i, text in enumerate(texts):
        p, k = chunk[i // n], i % n
        if (p.id, k) not in done:
            truncated = bool(comp.truncated[i])
            records.append(
                {
                    "id": p.id,
                    "sample": k,
                    "completion": text,
                    "extracted": extracted[i],
                    "gold": p.answer,
                    "correct": scores[i] == 1.0,
                    "length": int(comp.lengths[i]),
                    "truncated": truncated,
                    "zero_reason": zero_reason(scores[i] == 1.0, extracted[i], truncated, failures.get(i)),
                }
            )
    return records


def _summarise(s: EvalSettings, prompts: list, log: JsonlLog, out_dir: Path, run_dir: Path | None, settings: dict, skipped: dict) -> dict:
    """Warn about clipped budgets and failed grading, then write and return summary.json from samples.jsonl."""
    clipped, context = settings["clipped_prompts"], settings["context_window"]
    if clipped:
        console.print(
            f"[yellow]warning: {shown(s.dataset)}: max_new_tokens={s.max_new_tokens} did not fit the {context}-token context "
            f"for {clipped} prompts; each one's budget was clipped to the context minus its own length[/]"
        )
    ids = {p.id for p in prompts}
    rows = [r for r in read_jsonl(log.path) if r["id"] in ids]
    ends = outcomes(rows)
    if ends["timeout"] or ends["crash"]:
        console.print(
            f"[yellow]warning: {shown(s.dataset)}: grading timed out on {ends['timeout']} samples and crashed its worker on "
            f"{ends['crash']}; those scored 0 (zero_reason in samples.jsonl, counts in summary.json)[/]"
        )
    summary = {
        "dataset": s.dataset,
        "problems": len(ids),
        "samples": len(rows),
        "metrics": summarise(rows, s.n),
        "outcomes": ends,
        "verifier": {"timeouts": ends["timeout"], "crashes": ends["crash"]},
        "settings": settings,
        "skipped": skipped,
        "versions": versions(),
    }
    with writing(out_dir / "summary.json", out_dir, run_dir):
        write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def eval_during_training(model, tok, cfg: Config, run_dir: Path, step: int, pool, engine: Engine) -> dict[str, float]:
    """Periodic evaluation from the training loop (eval.*): RUN_DIR/eval/step-N/<dataset>/; flat metrics."""
    out: dict[str, float] = {}
    for name in cfg.eval.datasets or [cfg.data.name]:
        s = EvalSettings(
            model=str(run_dir),
            dataset=name,
            preset=cfg.eval.preset,
            n=cfg.eval.n,
            limit=cfg.eval.limit,
            max_new_tokens=cfg.eval.max_new_tokens,
            grader=cfg.verifier.grader,
            engine=engine.name,
            checkpoint=f"{run_dir} (in training)",
            checkpoint_step=step,
            batch_size=engine.slots,
        )
        s = resolve_settings(s, cfg)
        summary = eval_dataset(model, tok, s, cfg.data, run_dir / "eval" / f"step-{step}" / Path(s.dataset).stem, pool, engine, run_dir)
        for k, v in summary["metrics"].items():
            if not k.endswith(("_low", "_high")):
                out[f"eval/{Path(s.dataset).stem}/{k}"] = v
    return out


def evaluate(s: EvalSettings, datasets: list[str], output: Path | None, cfg: Config | None = None) -> list[dict]:
    """Evaluate `s.model` on each dataset; output/<dataset>/ per dataset (output itself when there is one). A
    run directory (or one of its checkpoints) is evaluated at its checkpoint, recorded in settings.json, and
    writes to RUN_DIR/eval/step-N/<dataset>/ by default. Datasets and presets are checked before the model loads."""
    from thinkrl import accel
    from thinkrl.verifier import VerifierPool

    check_engine(s.engine, "--engine")  # a bad name or a missing vLLM: before anything loads
    accel.process_start()  # as train does
    found = find_checkpoint(s.model)
    run_cfg = load_config(found[0] / "config.yaml") if found else None
    if found:
        s = replace(s, checkpoint=str(found[1]), checkpoint_step=checkpoint_step(found[1]))
    base = cfg or run_cfg or Config()
    plan = []  # (settings, output directory, problems) per dataset, checked before any model loads
    for name in datasets or [base.data.name]:
        settings = resolve_settings(replace(s, dataset=name), base)
        loaded = _load(settings, base.data, "--dataset")  # files, columns
        check_sample_count(settings, len(loaded.problems))
        stem = Path(settings.dataset).stem
        if output is not None:
            out_dir = output if len(datasets) <= 1 else output / stem
        else:
            out_dir = found[0] / "eval" / f"step-{s.checkpoint_step}" / stem if found else Path("eval") / stem
        check_output(out_dir)
        plan.append((settings, out_dir, loaded))
    summaries = []
    with contextlib.ExitStack() as held:
        for out_dir in dict.fromkeys(d for _, d, _ in plan):  # before the model loads: a second eval into one output fails at once
            held.callback(_locked(out_dir, None).release)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model, tok, _ = load_for_eval(s.model, s.adapter, device)
        saved = found and (found[1] / "model").is_dir()  # a full-weights checkpoint
        path = str(found[1] / "model") if saved else resolve_path(run_cfg.model.name if run_cfg else s.model)
        engine = make_engine(s.engine, device, s.batch_size, s.max_new_tokens or 0, "--engine", model, model_path=path)
        console.print(f"sampling: {shown(describe_path(engine, model).line())}", soft_wrap=True)
        with VerifierPool() as pool, contextlib.closing(engine):
            for settings, out_dir, loaded in plan:
                summaries.append(_eval_dataset(model, tok, settings, loaded, out_dir, pool, engine))
                console.print(f"written: {shown(out_dir)}/summary.json, {shown(out_dir)}/samples.jsonl")
    return summaries
