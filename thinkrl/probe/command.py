"""`thinkrl probe`: one update of each method from one starting point, over hundreds of paired replicates."""

from __future__ import annotations

from pathlib import Path

import typer

from thinkrl.errors import UserError


def probe(
    file: Path | None = typer.Argument(None, help="A probe file (YAML: arms with their parameters, starting run, primary measures)."),
    methods: str | None = typer.Option(None, "--methods", help="Comma-separated; the first is the baseline [default: grpo,gspo,cispo]."),
    replicates: int | None = typer.Option(None, "--replicates", help="Mini-batches; every method is measured on each [default: 200]."),
    groups: int | None = typer.Option(None, "--groups", help="Prompt groups per replicate (sampled for it alone) [default: 1]."),
    stale_prompts: int | None = typer.Option(None, "--stale-prompts", help="Prompt groups the stale grpo steps train on [default: 8]."),
    stale_updates: int | None = typer.Option(
        None, "--stale-updates", help="grpo steps from the sampler to the probed policy [default: 2]."
    ),
    reference_prompts: int | None = typer.Option(None, "--reference-prompts", help="Groups of the on-policy reference [default: 32]."),
    seed: int | None = typer.Option(None, "--seed", help="[default: 0]"),
    old_policy: str | None = typer.Option(
        None, "--old-policy", help="pi_old: the sampler's log-probs (sampler) or the trainer's, recomputed (recompute) [default: sampler]."
    ),
    start: Path | None = typer.Option(
        None, "--from", help="A run directory (its newest checkpoint) or RUN_DIR/checkpoints/step-N: the starting policy and its config."
    ),
    model: str | None = typer.Option(None, "--model", help="Hub id, local path or alias (default: the bundled model)."),
    dataset: str | None = typer.Option(None, "--dataset", help="Dataset (default: the built-in arithmetic task)."),
    config: Path | None = typer.Option(None, "--config", help="A training config file for the shared regime."),
    override: list[str] = typer.Option([], "--override", "-o", help="key=value for the shared regime (repeatable)."),
    output: Path | None = typer.Option(
        None, "--output", help="Directory for probe.json and probe.md [default: probe, or probes/NAME for a file]."
    ),
) -> None:
    """What one update of each method does, from one starting point, over paired replicates.

    The starting policy samples every rollout, then takes --stale-updates grpo steps on a separate batch (as in
    the later mini-batches of an update phase); each replicate gets its own --groups prompt groups and every
    method's gradient on them: its entropy slope, cosine with an on-policy reference gradient, KL slope (away
    from the starting policy), norm and clip fraction, with intervals and Holm-adjusted paired differences
    against the first method."""
    from thinkrl.probe.session import run_probe
    from thinkrl.run.intact import find_checkpoint
    from thinkrl.settings import load_config, resolve

    flags = {"replicates": replicates, "groups": groups, "stale_prompts": stale_prompts, "stale_updates": stale_updates,
             "reference_prompts": reference_prompts, "seed": seed, "old_policy": old_policy}  # fmt: skip
    taken = [
        f for f, v in (("--methods", methods), ("--from", start), ("--model", model), ("--dataset", dataset), ("--config", config)) if v
    ]
    if file is not None and taken:
        raise UserError(f"{taken[0]} with a probe file: the file names the arms, the starting run and the regime; drop {taken[0]}")
    ps, primary, extra, output = _probe_settings(file, methods, flags, output)
    start = output / "start" if file is not None else start
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
    cfg = resolve(load_config(config, [*extra, *override], recipe=False, **shorthands))
    results, begin = run_probe(cfg, ps, ckpt)
    _report(output, cfg, ps, primary, results, {"from": str(ckpt) if ckpt else None, **{k: float(f"{v:.4g}") for k, v in begin.items()}})


def _report(output: Path, cfg, ps, primary: tuple[str, ...], results: list, begin: dict) -> None:
    from thinkrl.probe.measure import as_arm
    from thinkrl.probe.report import summarise, write

    arms = [as_arm(a) for a in ps.methods]
    setting = {"model": cfg.model.name, "data": cfg.data.name, "group_size": cfg.rollout.group_size, "lr": cfg.train.lr,
               "arms": {a.label: {"method": a.method, **dict(a.params)} for a in arms}, "groups": ps.groups,
               "stale_prompts": ps.stale_prompts, "stale_updates": ps.stale_updates, "reference_prompts": ps.reference_prompts,
               "seed": ps.seed, "old_policy": ps.old_policy, **begin}  # fmt: skip
    summary = summarise(results, [a.label for a in arms], primary)
    write(output, summary, setting, results)
    for c in summary["comparisons"]:
        print(f"- {c['verdict']}")
    print(f"probe: {output / 'probe.md'} (and probe.json); {begin['seconds']:.0f} s")


def _probe_settings(file: Path | None, methods: str | None, flags: dict, output: Path | None):
    """(settings, primary measures, the file's regime overrides, output directory) from a probe file (whose
    starting run is trained first if it is not there) or from the flags alone."""
    from thinkrl.probe.measure import ProbeSettings, check_old_policy
    from thinkrl.probe.spec import load_probe_file, train_start

    for flag, least in (("replicates", 2), ("groups", 1), ("stale_prompts", 1), ("stale_updates", 0), ("reference_prompts", 1)):
        if flags[flag] is not None and flags[flag] < least:
            raise UserError(f"--{flag.replace('_', '-')} {flags[flag]}: must be >= {least}")
    if flags["old_policy"] is not None:
        check_old_policy(flags["old_policy"], "--old-policy")
    if file is not None:
        pf = load_probe_file(file)
        output = output or Path("probes") / pf.name
        train_start(pf, output / "start")
        return pf.probe_settings(**flags), pf.primary, list(pf.overrides), output
    names = tuple(m.strip() for m in (methods or "grpo,gspo,cispo").split(",") if m.strip())
    if len(names) < 2 or len(set(names)) < len(names):
        raise UserError(f"--methods {methods}: name two or more distinct methods, e.g. --methods grpo,gspo,cispo")
    return ProbeSettings(names, **{k: v for k, v in flags.items() if v is not None}), (), [], output or Path("probe")
