"""Command line: thinkrl train | eval | serve | config | methods | study | probe | plot | compare | show | export.
Parses, calls, prints; no logic lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

import typer

from thinkrl.errors import UserError, capped
from thinkrl.preview.command import check_override_spacing, one_config
from thinkrl.preview.command import config as config_command
from thinkrl.probe.command import probe as probe_command
from thinkrl.serve import serve as serve_command
from thinkrl.study.command import study as study_command

# choices listed in --help and checked before anything loads
Preset = Literal["auto", "train", "greedy", "reasoning"]  # thinkrl/evaluation/settings.py
Template = Literal["auto", "chat", "plain"]
EngineName = Literal["auto", "lean", "transformers", "vllm"]  # thinkrl/rollout/engines/
Dtype = Literal["float32", "bfloat16", "float16"]

HELP = "thinkrl: compare GRPO-family policy-loss methods on one GPU (or a laptop CPU)."
app = typer.Typer(add_completion=False, rich_markup_mode="rich", no_args_is_help=True, pretty_exceptions_enable=False, help=HELP)
_debug = False
app.command("study")(study_command)  # the grid and its report (thinkrl/study/command.py)
app.command("probe")(probe_command)  # one update of each method over independent starts and paired replicates (thinkrl/probe/command.py)
app.command("config")(config_command)  # the config a train command runs with, before it runs (thinkrl/preview/command.py)
app.command("serve")(serve_command)  # the vLLM server a rollout.engine=vllm_server run samples from (thinkrl/serve.py)


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors.")) -> None:
    global _debug
    _debug = debug


RECIPE_HELP = "Whose regime: a method's name (e.g. --method grpo --recipe ctpo), or none. Default: the method's own."


# over 60 lines: most of it declares the options
@app.command()
def train(
    config: Path | None = typer.Argument(None, help="YAML config (only what differs from the defaults)."),
    config_option: Path | None = typer.Option(None, "--config", help="Same as CONFIG."),
    method: str | None = typer.Option(None, "--method", "-m", help="Policy-loss method (see `thinkrl methods`)."),
    model: str | None = typer.Option(None, "--model", help="Hub id, local path, or alias smollm2-135m."),
    dataset: str | None = typer.Option(None, "--dataset", help="arith, an alias, a hub id or a .jsonl/.parquet/.csv file."),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", "-O", help="Run directory, new or empty (default runs/<time>-<random>-<method>)."
    ),
    override: list[str] = typer.Option([], "--override", "-o", help="key=value, e.g. -o train.lr=1e-4 (repeatable)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue RUN_DIR from its newest intact checkpoint."),
    allow_changes: bool = typer.Option(
        False,
        "--allow-changes",
        help="With --resume: continue even though what makes the run (model, LoRA, method, data, prompts, reward, grader, "
        "sampling, loss, a seed) differs from RUN_DIR/config.yaml (recorded in RUN_DIR/changes.jsonl).",
    ),
    plugins: Path | None = typer.Option(None, "--plugins", help="Directory of extra method files."),
    recipe: str | None = typer.Option(None, "--recipe", help=RECIPE_HELP),
    no_recipe: bool = typer.Option(False, "--no-recipe", help="Same as --recipe none."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sampling path and peak memory by part; load no weights."),
    processes: int | None = typer.Option(None, "--processes", help="With --dry-run: N trainer processes, one device each (default 1)."),
    sharding: str | None = typer.Option(
        None, "--sharding", help="With --dry-run: none (DDP, default) or fsdp2 (weights, grads, AdamW sharded)."
    ),
    server_devices: int | None = typer.Option(None, "--server-devices", help="With --dry-run: a vLLM server samples on M other devices."),
    device: str | None = typer.Option(None, "--device", help="With --dry-run: auto (this machine), cpu or cuda (bf16, GPU memory)."),
) -> None:
    """Train a policy with GRPO-family RL. With no arguments: bundled model, built-in arithmetic, grpo.

    --method NAME applies the method's recipe, the regime its paper studies, beneath CONFIG and -o; --recipe OTHER
    applies OTHER's regime instead (compare two losses in one regime), --recipe none no recipe.

    --resume RUN_DIR continues from the newest intact checkpoint with RUN_DIR/config.yaml; -o may change train.steps,
    the optimizer, memory, logging, eval and checkpoint settings. A change to what the run optimises or samples (model,
    LoRA, method, data, prompts, reward, grader, rollout sampling, advantages, correction, seeds: docs/runs.md) is refused
    unless --allow-changes; every change is printed, recorded in RUN_DIR/changes.jsonl, and config.yaml takes it."""
    from thinkrl.methods import load_plugins
    from thinkrl.preview.layout import from_flags
    from thinkrl.run.resume import resumed_config
    from thinkrl.settings import load_config, recipe_flag
    from thinkrl.train import train as run_train

    if plugins:
        load_plugins(plugins)
    check_override_spacing(override, config)
    config = one_config(config, config_option)
    layout = from_flags(processes, sharding, server_devices, device, dry_run)
    if allow_changes and resume is None:
        raise UserError("--allow-changes applies only with --resume RUN_DIR; drop it for a new run")
    if resume is not None:
        config, output_dir = resumed_config(resume, config, method, allow_changes), resume
    shorthands = {"method.name": method, "model.name": model, "data.name": dataset, "output_dir": str(output_dir) if output_dir else None}
    cfg = load_config(config, override, recipe=recipe_flag(recipe, no_recipe), **shorthands)
    if dry_run:
        from thinkrl.preview.dry_run import dry_run as preview_run

        return preview_run(cfg, layout)
    run_train(cfg, resume=resume is not None, allow_changes=allow_changes)


# over 60 lines: most of it declares the options
@app.command("eval")
def eval_(
    model: str = typer.Option("smollm2-135m", "--model", help="Hub id, local path, alias, RUN_DIR or RUN_DIR/checkpoints/step-N."),
    dataset: str | None = typer.Option(
        None,
        "--dataset",
        help="Comma-separated: arith, aime24, aime25, amc23, math500, gsm8k, hub ids or files (default: the run's dataset).",
    ),
    preset: Preset = typer.Option("auto", "--preset", help="The protocol (docs/evaluation.md); flags below override it."),
    output: Path | None = typer.Option(
        None, "--output", help="Output directory (default RUN_DIR/eval/step-N/<dataset> for a run, else eval/<dataset>)."
    ),
    n: int | None = typer.Option(None, "--n", help="Samples per problem."),
    limit: int = typer.Option(0, "--limit", help="Evaluate the first K problems (0 = all)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Completion budget (clipped to the context window)."),
    temperature: float | None = typer.Option(None, "--temperature", help="0 = greedy."),
    top_p: float | None = typer.Option(None, "--top-p"),
    system: str | None = typer.Option(None, "--system", help="System prompt ('none' removes the preset's)."),
    instruction: str | None = typer.Option(None, "--instruction", help="User message; {problem} is replaced by the problem."),
    template: Template | None = typer.Option(None, "--template", help="Prompt template (default: the preset's)."),
    seed: int = typer.Option(0, "--seed"),
    split: str | None = typer.Option(None, "--split", help="Dataset split (arith: test; aliases: their own)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Completions decoded together (the engine's slots)."),
    engine: EngineName = typer.Option("auto", "--engine", help="What samples (docs/engines.md)."),
    config: Path | None = typer.Option(None, "--config", help="Take the prompt template and task settings from this train config."),
    adapter: Path | None = typer.Option(None, "--adapter", help="A peft adapter directory to apply to --model."),
    as_json: bool = typer.Option(False, "--json", help="Print the summaries as JSON."),
) -> None:
    """Evaluate a model or a training run: avg@n, pass@k and maj@n per dataset."""
    from thinkrl.evaluation.evaluate import evaluate
    from thinkrl.evaluation.settings import EvalSettings
    from thinkrl.settings import load_config

    if limit < 0:
        raise UserError(f"--limit must be >= 0 (0 = every problem), got {limit}")
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1 (completions decoded together), got {batch_size}")
    cfg = load_config(config) if config else None
    settings = EvalSettings(
        model=model,
        dataset="",
        preset=preset,
        split=split,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        template=template,
        system=system,
        instruction=instruction,
        seed=seed,
        limit=limit,
        batch_size=batch_size,
        adapter=str(adapter) if adapter else None,
        engine=engine,
    )
    datasets = [d.strip() for d in dataset.split(",") if d.strip()] if dataset else []
    summaries = evaluate(settings, datasets, output, cfg)
    if as_json:
        print(json.dumps(summaries if len(summaries) > 1 else summaries[0], indent=2))
    else:
        from thinkrl.evaluation.metrics import print_table

        print_table(summaries)


@app.command()
def methods(
    name: str | None = typer.Argument(None, help="Show one method's documentation and config fields."),
    plugins: Path | None = typer.Option(None, "--plugins", help="Directory of extra method files."),
) -> None:
    """List the registered policy-loss methods, or describe one."""
    from thinkrl.methods import available_methods, load_plugins, method_class

    if plugins:
        load_plugins(plugins)
    if name:
        print(method_class(name).help())
        return
    names = available_methods()
    width = max(len(n) for n in names)
    for n in names:
        print(f"{n:<{width}}  {method_class(n).summary()}")


@app.command()
def plot(
    runs: list[Path] = typer.Argument(..., help="Run directories (one line per run, labelled by method)."),
    out: Path = typer.Option(Path("runs.png"), "--out", help="Image file (.png, .pdf or .svg)."),
    smooth: int = typer.Option(1, "--smooth", help="Moving average over N steps (1 = raw)."),
    title: str | None = typer.Option(None, "--title"),
    metrics: list[str] = typer.Option(
        [], "--metrics", help="Panels: metrics.jsonl keys or globs, one panel per key, e.g. 'ratio/*' (repeatable or comma-separated)."
    ),
) -> None:
    """Plot reward, entropy, completion length, clip/mask fractions and eval accuracy (or --metrics) against step.

    Runs that differ only in train.seed are drawn as their mean with a min-max band."""
    from thinkrl.run.plot import plot_runs
    from thinkrl.run.readers import load_runs

    if smooth < 1:
        raise UserError("--smooth must be >= 1 (1 = no smoothing)")
    if out.suffix.lower() not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
        raise UserError(f"--out {out}: end the name in .png, .pdf, .svg or .jpg (the format follows the suffix)")
    patterns = [p.strip() for m in metrics for p in m.split(",") if p.strip()]
    print(plot_runs(load_runs(runs), out, smooth, title, patterns or None))


@app.command()
def compare(
    runs: list[Path] = typer.Argument(..., help="Run directories."),
    tail: int = typer.Option(10, "--tail", help="'final' = mean over the last N logged steps."),
) -> None:
    """A table of final and best values per run: reward, entropy, length, clip/mask fractions, eval accuracy."""
    from rich.table import Table

    from thinkrl.run.console import console, shown
    from thinkrl.run.readers import compare_rows, load_runs

    if tail < 1:
        raise UserError("--tail must be >= 1")
    header, rows = compare_rows(load_runs(runs), tail)
    table = Table(title=f"thinkrl compare (final = mean of the last {tail} steps)")
    for i, col in enumerate(header):  # run labels and metric names come from config.yaml and metrics.jsonl: text
        table.add_column(shown(col), justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*map(shown, row))
    console.print(table)


@app.command()
def show(
    run_dir: Path = typer.Argument(..., help="A run directory."),
    step: int | None = typer.Option(None, "--step", help="Which logged step (default: the last)."),
    groups: int = typer.Option(2, "--groups", help="How many prompt groups to print (0 = all)."),
    max_chars: int = typer.Option(600, "--max-chars", help="Cut each completion to this many characters (0 = whole)."),
) -> None:
    """Print a step's completions with their rewards, advantages and extracted answers, grouped by prompt.

    Prompts, answers and completions are printed as text: terminal escapes in them are shown, not obeyed."""
    from thinkrl.run.readers import print_rollouts

    for flag, value, zero in (("--groups", groups, "all"), ("--max-chars", max_chars, "whole")):
        if value < 0:
            raise UserError(f"{flag} must be >= 0 (0 = {zero}), got {value}")
    print_rollouts(run_dir, step, groups, max_chars)


@app.command()
def export(
    source: Path = typer.Argument(..., help="RUN_DIR (its newest checkpoint) or RUN_DIR/checkpoints/step-N."),
    out: Path = typer.Option(..., "--out", help="New directory to write."),
    merge: bool = typer.Option(False, "--merge", help="Fold the LoRA adapter into the base weights: a plain transformers model."),
    dtype: Dtype = typer.Option("float32", "--dtype", help="Weights of a merged model."),
) -> None:
    """Export a checkpoint: a peft adapter, or with --merge a model AutoModelForCausalLM (and vLLM) load."""
    from thinkrl.run.export import export as run_export

    run_export(source, out, merge, dtype)


# the option parser's errors: typer's own copy of click's ClickException (click's own in older typer)
ParserError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def run() -> None:
    """Console-script entry point: user errors and the option parser's are one line and exit status 2."""
    try:
        code = app(standalone_mode=False)  # parser errors are raised here, not drawn as typer's panel
    except (UserError, ParserError) as e:
        if _debug and isinstance(e, UserError):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `thinkrl`: the help is already printed
            sys.exit(2)
        from thinkrl.run.console import printable

        ctx = getattr(e, "ctx", None)
        text = str(e) if isinstance(e, UserError) else e.format_message() + (f"; see {ctx.command_path} --help" if ctx else "")
        # one line (scripts grep "error:"), escapes shown not obeyed, at most MAX_MESSAGE_CHARS (thinkrl/errors.py)
        line = printable(" ".join(line.strip() for line in text.splitlines() if line.strip()))
        print("error: " + capped(line), file=sys.stderr)
        sys.exit(2)
    except typer.Abort:  # end of input at a prompt
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(N) comes back as N


if __name__ == "__main__":
    run()
