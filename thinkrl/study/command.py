"""`thinkrl study FILE` (run the grid, then report), `thinkrl study FILE --commands` (print the pending runs for
another scheduler) and `thinkrl study report DIR` (the report of whatever has finished)."""

from __future__ import annotations

from pathlib import Path

import typer

from thinkrl.errors import UserError


def study(
    target: str = typer.Argument(..., help="A study file (YAML), or `report` followed by a study directory."),
    directory: Path | None = typer.Argument(None, help="With `report`: the study directory."),
    output_dir: Path | None = typer.Option(None, "--output-dir", help="The study directory (default: studies/<name>)."),
    jobs: int = typer.Option(1, "--jobs", help="Runs at once (a GPU machine: one per device; a CPU: they share the cores)."),
    commands: bool = typer.Option(False, "--commands", help="Print one `thinkrl train` line per pending run and exit."),
) -> None:
    """Compare methods: arms x paired seeds in one regime, then a report with intervals and power.

    Every arm (a method plus overrides) trains on the same seeds in the study's shared regime; the report gives
    per-arm intervals, paired differences, Holm-adjusted p-values and the minimum detectable effect. Resumable:
    run the same command again after an interruption (finished runs are kept, unfinished ones continue from
    their last checkpoint). `thinkrl study report DIR` reports whatever has finished."""
    from thinkrl.run.console import console  # here, not above: `thinkrl --help` imports this file
    from thinkrl.study.grid import cells, check_study_dir, last_error, open_study, run_grid, shell_line
    from thinkrl.study.spec import load_study

    if target == "report":
        if directory is None:
            raise UserError("thinkrl study report DIR: name the study directory (the one holding study.yaml)")
        _report(_declared(directory), directory)
        return
    if directory is not None:
        raise UserError(f"thinkrl study {target} {directory}: one study file at a time (use --output-dir for the directory)")
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be >= 1")
    if output_dir is not None:
        check_study_dir(output_dir)  # before any work
    spec = load_study(Path(target))
    if spec.plugins:  # its methods are known here too: the inputs and metrics checks build each arm's config
        from thinkrl.methods import load_plugins

        load_plugins(spec.plugins)
    from thinkrl.study.known import check_metrics

    check_metrics(spec, target)  # a metric no arm logs, refused before anything runs
    study_dir = output_dir or Path("studies") / spec.name
    open_study(spec, study_dir)
    if commands:
        for cell in cells(spec, study_dir):
            if cell.state != "done":
                print(shell_line(spec, cell))
        return
    try:
        failed = run_grid(spec, study_dir, jobs)
    except KeyboardInterrupt:
        console.print(f"study stopped; continue with: thinkrl study {target} --output-dir {study_dir}", soft_wrap=True)
        raise typer.Exit(130) from None
    _report(spec, study_dir)
    if failed:
        for cell in failed:
            console.print(f"[red]{cell.arm.name}/seed-{cell.seed} failed: {last_error(cell.log)} (log: {cell.log})[/]", soft_wrap=True)
        raise UserError(f"{len(failed)} run(s) of the study failed (above); fix the cause and run the same command to continue")


def _declared(directory: Path):
    from thinkrl.study.grid import DECLARED, read_declared

    if not (directory / DECLARED).is_file():
        raise UserError(f"{directory}: no {DECLARED}, so not a study directory (thinkrl study FILE creates one)")
    return read_declared(directory)


def _report(spec, study_dir: Path) -> None:
    from thinkrl.run.console import console
    from thinkrl.study.report import threads_note, write_report
    from thinkrl.study.soundness import counts

    result = write_report(spec, study_dir)
    for arm, per in result["arms"].items():
        for metric, r in per.items():
            unsound = {s: why for why, key in (("diverged", "diverged"), ("did not train", "did_not_train")) for s in r[key]}
            if unsound:
                seeds = ", ".join(map(str, sorted(unsound)))
                console.print(f"[yellow]{arm}, {metric}: {counts(unsound)} (seeds {seeds}); left out of its comparisons[/]", soft_wrap=True)
    for c in result["comparisons"]:
        console.print(f"- {c['verdict']}", soft_wrap=True, markup=False)
    if result["missing"]:
        console.print(f"not finished (left out of the report): {', '.join(result['missing'])}", soft_wrap=True)
    if threads_note(result["threads"]):
        console.print(threads_note(result["threads"]), soft_wrap=True, markup=False)
    console.print(f"report: {study_dir / 'report.md'} (and report.json, curves.png)")
