"""`thinkrl probe`: one update of each method from one starting point, over hundreds of paired replicates."""

from __future__ import annotations

from pathlib import Path

import typer

from thinkrl.errors import UserError


def probe(
    methods: str = typer.Option("grpo,gspo,cispo", "--methods", help="Comma-separated; the first is the baseline of the comparisons."),
    replicates: int = typer.Option(200, "--replicates", help="Mini-batches drawn; each method's update is measured on every one."),
    groups: int = typer.Option(1, "--groups", help="Prompt groups per replicate (sampled for it alone)."),
    stale_prompts: int = typer.Option(8, "--stale-prompts", help="Prompt groups of the batch the stale grpo steps train on."),
    stale_updates: int = typer.Option(2, "--stale-updates", help="grpo steps between the sampler (pi_old) and the probed policy."),
    reference_prompts: int = typer.Option(32, "--reference-prompts", help="Prompt groups of the on-policy reference gradient."),
    seed: int = typer.Option(0, "--seed"),
    start: Path | None = typer.Option(
        None, "--from", help="A run directory (its newest checkpoint) or RUN_DIR/checkpoints/step-N: the starting policy and its config."
    ),
    model: str | None = typer.Option(None, "--model", help="Hub id, local path or alias (default: the bundled model)."),
    dataset: str | None = typer.Option(None, "--dataset", help="Dataset (default: the built-in arithmetic task)."),
    config: Path | None = typer.Option(None, "--config", help="A training config file for the shared regime."),
    override: list[str] = typer.Option([], "--override", "-o", help="key=value for the shared regime (repeatable)."),
    output: Path = typer.Option(Path("probe"), "--output", help="Directory for probe.json and probe.md."),
) -> None:
    """What one update of each method does, from one starting point, over paired replicates.

    The starting policy samples every rollout, then takes --stale-updates grpo steps on a separate batch (as in
    the later mini-batches of an update phase); each replicate gets its own --groups prompt groups and every
    method's gradient on them: its entropy slope, cosine with an on-policy reference gradient, KL slope (away
    from the starting policy), norm and clip fraction, with intervals and Holm-adjusted paired differences
    against the first method."""
    from thinkrl.probe.measure import ProbeSettings
    from thinkrl.probe.report import summarise, write
    from thinkrl.probe.session import run_probe
    from thinkrl.run.intact import find_checkpoint
    from thinkrl.settings import load_config, resolve

    names = tuple(m.strip() for m in methods.split(",") if m.strip())
    if len(names) < 2 or len(set(names)) < len(names):
        raise UserError(f"--methods {methods}: name two or more distinct methods, e.g. --methods grpo,gspo,cispo")
    for flag, value, least in (("--replicates", replicates, 2), ("--groups", groups, 1), ("--stale-prompts", stale_prompts, 1),
                               ("--stale-updates", stale_updates, 0), ("--reference-prompts", reference_prompts, 1)):  # fmt: skip
        if value < least:
            raise UserError(f"{flag} {value}: must be >= {least}")
    shorthands = {"model.name": model, "data.name": dataset}
    ckpt = None
    if start is not None:
        found = find_checkpoint(str(start))
        if found is None:
            raise UserError(f"--from {start}: not a run directory or RUN_DIR/checkpoints/step-N")
        if config is not None or model is not None:
            raise UserError("--from takes the model and config of the run; drop --config / --model (-o still applies)")
        run_dir, ckpt = found
        config = run_dir / "config.yaml"
    cfg = resolve(load_config(config, override, recipe=False, **shorthands))
    ps = ProbeSettings(names, replicates, groups, stale_prompts, stale_updates, reference_prompts, seed)
    results, begin = run_probe(cfg, ps, ckpt)
    setting = {"model": cfg.model.name, "data": cfg.data.name, "group_size": cfg.rollout.group_size, "lr": cfg.train.lr,
               "groups": groups, "stale_prompts": stale_prompts, "stale_updates": stale_updates, "reference_prompts": reference_prompts,
               "seed": seed, "from": str(ckpt) if ckpt else None, **{k: round(v, 4) for k, v in begin.items()}}  # fmt: skip
    summary = summarise(results, list(names))
    write(output, summary, setting, results)
    for c in summary["comparisons"]:
        print(f"- {c['verdict']}")
    print(f"probe: {output / 'probe.md'} (and probe.json); {begin['seconds']:.0f} s")
