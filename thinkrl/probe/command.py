"""`thinkrl probe`: one update of each method, over independent starting points and paired replicates within each."""

from __future__ import annotations

from pathlib import Path

import typer

from thinkrl.errors import UserError


def probe(
    file: Path | None = typer.Argument(None, help="A probe file (YAML: arms with their parameters, starting run, primary measures)."),
    methods: str | None = typer.Option(None, "--methods", help="Comma-separated; the first is the baseline [default: grpo,gspo,cispo]."),
    replicates: int | None = typer.Option(
        None, "--replicates", help="Mini-batches per start; every method is measured on each [default: 200]."
    ),
    groups: int | None = typer.Option(None, "--groups", help="Prompt groups per replicate (sampled for it alone) [default: 1]."),
    stale_prompts: int | None = typer.Option(None, "--stale-prompts", help="Prompt groups the stale grpo steps train on [default: 8]."),
    stale_updates: int | None = typer.Option(
        None, "--stale-updates", help="grpo steps from the sampler to the probed policy [default: 2]."
    ),
    reference_prompts: int | None = typer.Option(None, "--reference-prompts", help="Groups of the on-policy reference [default: 32]."),
    seed: int | None = typer.Option(None, "--seed", help="The first start's seed; start k takes seed + k [default: 0]."),
    starts: int | None = typer.Option(
        None,
        "--starts",
        help="Independent starting points (own start run, data and reference each); the verdict is across them [default: 1].",
    ),
    only_start: int | None = typer.Option(
        None,
        "--only-start",
        help="Run start K alone (0-based) into OUTPUT/start-K.json, e.g. one background job per start; then run without it to summarise.",
    ),
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
    """What one update of each method does, over independent starting points and paired replicates.

    The starting policy samples every rollout, then takes --stale-updates grpo steps on a separate batch (as in
    the later mini-batches of an update phase); each replicate gets its own --groups prompt groups and every
    method's gradient on them: its entropy slope, cosine with an on-policy reference gradient, KL slope (away
    from the starting policy), norm and clip fraction. Each start repeats all of it from its own seed (a probe
    file trains each start's policy); the paired differences against the first method are taken across starts,
    Holm-adjusted over the primary measures."""
    from thinkrl.probe.starts import run_starts

    flags = {"replicates": replicates, "groups": groups, "stale_prompts": stale_prompts, "stale_updates": stale_updates,
             "reference_prompts": reference_prompts, "seed": seed, "old_policy": old_policy, "starts": starts}  # fmt: skip
    _check_sources(file, {"--methods": methods, "--from": start, "--model": model, "--dataset": dataset, "--config": config})
    ps, pf, extra, output = _probe_settings(file, methods, flags, output)
    if only_start is not None and not 0 <= only_start < ps.starts:
        raise UserError(f"--only-start {only_start}: this probe has starts 0 to {ps.starts - 1}")
    check_output(output)  # before any work: a file in the way would otherwise fail only at the end
    regime = {"model.name": model, "data.name": dataset, "config": config, "from": start, "overrides": [*extra, *override]}
    run_starts(output, ps, pf, regime, only_start)


def _check_sources(file: Path | None, given: dict) -> None:
    """A probe file names the arms, the start and the regime; --from names the model and config."""
    taken = [flag for flag, v in given.items() if v]
    if file is not None and taken:
        raise UserError(f"{taken[0]} with a probe file: the file names the arms, the starting run and the regime; drop {taken[0]}")
    if given["--from"] is not None and (given["--config"] is not None or given["--model"] is not None):
        raise UserError("--from takes the model and config of the run; drop --config / --model (-o still applies)")


def check_output(output: Path) -> None:
    """The output directory exists or can be made, and is not a file."""
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output}: a file is in the way; name a directory (it is made if missing)")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--output {output}: cannot make the directory ({e.strerror}); name another") from None


def _probe_settings(file: Path | None, methods: str | None, flags: dict, output: Path | None):
    """(settings, the probe file or None, the file's regime overrides, output directory) from a probe file or
    from the flags alone."""
    from thinkrl.probe.measure import ProbeSettings, check_old_policy
    from thinkrl.probe.spec import load_probe_file

    for flag, least in (
        ("replicates", 2),
        ("groups", 1),
        ("stale_prompts", 1),
        ("stale_updates", 0),
        ("reference_prompts", 1),
        ("starts", 1),
    ):
        if flags[flag] is not None and flags[flag] < least:
            raise UserError(f"--{flag.replace('_', '-')} {flags[flag]}: must be >= {least}")
    if flags["old_policy"] is not None:
        check_old_policy(flags["old_policy"], "--old-policy")
    if file is not None:
        pf = load_probe_file(file)
        return pf.probe_settings(**flags), pf, list(pf.overrides), output or Path("probes") / pf.name
    names = tuple(m.strip() for m in (methods or "grpo,gspo,cispo").split(",") if m.strip())
    if len(names) < 2 or len(set(names)) < len(names):
        raise UserError(f"--methods {methods}: name two or more distinct methods, e.g. --methods grpo,gspo,cispo")
    return ProbeSettings(names, **{k: v for k, v in flags.items() if v is not None}), None, [], output or Path("probe")
