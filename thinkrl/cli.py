"""Command line: thinkrl train | eval | methods. Parses, calls, prints; no logic lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from thinkrl.errors import UserError

app = typer.Typer(
    add_completion=False,
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="thinkrl: compare GRPO-family policy-loss methods on one GPU (or a laptop CPU).",
)
_debug = False


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors.")) -> None:
    global _debug
    _debug = debug


@app.command()
def train(
    config: Path | None = typer.Argument(None, help="YAML config (only what differs from the defaults)."),
    method: str | None = typer.Option(None, "--method", "-m", help="Policy-loss method (see `thinkrl methods`)."),
    model: str | None = typer.Option(None, "--model", help="Hub id, local path, or alias smollm2-135m."),
    dataset: str | None = typer.Option(None, "--dataset", help="arith, an alias, a hub id or a .jsonl/.parquet/.csv file."),
    output_dir: Path | None = typer.Option(None, "--output-dir", "-O", help="Run directory (default runs/<time>-<method>)."),
    override: list[str] = typer.Option([], "--override", "-o", help="key=value, e.g. -o train.lr=1e-4 (repeatable)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue RUN_DIR from its newest complete checkpoint."),
    plugins: Path | None = typer.Option(None, "--plugins", help="Directory of extra method files."),
) -> None:
    """Train a policy with GRPO-family RL. With no arguments: bundled model, built-in arithmetic, grpo."""
    from thinkrl.config import load_config
    from thinkrl.methods import load_plugins
    from thinkrl.train import train as run_train

    if plugins:
        load_plugins(plugins)
    if resume is not None:
        if config is not None:
            raise UserError("--resume uses RUN_DIR/config.yaml; drop the CONFIG argument (overrides with -o still apply)")
        if not (resume / "config.yaml").is_file():
            raise UserError(f"--resume {resume}: no config.yaml there, so it is not a thinkrl run directory")
        config = resume / "config.yaml"
        output_dir = resume
    shorthands = {"method.name": method, "model.name": model, "data.name": dataset, "output_dir": str(output_dir) if output_dir else None}
    cfg = load_config(config, override, **shorthands)
    run_train(cfg, resume=resume is not None)


@app.command("eval")
def eval_(
    model: str = typer.Option("smollm2-135m", "--model", help="Hub id, local path, alias, RUN_DIR or RUN_DIR/checkpoints/step-N."),
    dataset: str | None = typer.Option(None, "--dataset", help="arith, an alias, a hub id or a file (default: the run's dataset)."),
    output: Path | None = typer.Option(None, "--output", help="Output directory (default RUN_DIR/eval/<dataset> or eval/<dataset>)."),
    n: int = typer.Option(1, "--n", help="Samples per problem."),
    limit: int = typer.Option(0, "--limit", help="Evaluate the first K problems (0 = all)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Completion budget (default: the run's own budget on its own dataset, else 512)."),
    temperature: float | None = typer.Option(None, "--temperature", help="Default: 0 (greedy) when n = 1, else 0.6."),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    split: str | None = typer.Option(None, "--split", help="Dataset split (arith: test by default)."),
    config: Path | None = typer.Option(None, "--config", help="Take prompt template and task settings from this train config."),
    adapter: Path | None = typer.Option(None, "--adapter", help="A peft adapter directory to apply to --model."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Evaluate a model or a training run: avg@n and pass@k over a dataset."""
    from thinkrl.config import load_config
    from thinkrl.evaluate import EvalSettings, evaluate, find_checkpoint

    if n < 1 or (max_new_tokens is not None and max_new_tokens < 1) or limit < 0:
        raise UserError("--n and --max-new-tokens must be >= 1 and --limit >= 0")
    cfg = load_config(config) if config else None
    settings = EvalSettings(model, dataset or "", split, n, limit, max_new_tokens, temperature, top_p, seed, adapter=str(adapter) if adapter else None)
    if output is None:
        found = find_checkpoint(model)
        name = Path(dataset or (cfg.data.name if cfg else "arith")).stem
        output = (found[0] / "eval" / name) if found else Path("eval") / name
    summary = evaluate(settings, output, cfg)
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        from thinkrl.logs import console

        metrics = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in summary["metrics"].items())
        console.print(f"{summary['dataset']}: {summary['problems']} problems, {summary['samples']} samples  {metrics}")
        console.print(f"written: {output}/summary.json, {output}/samples.jsonl")


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


def run() -> None:
    """Console-script entry point: user errors are one line and exit status 2."""
    try:
        app()
    except UserError as e:
        if _debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
