"""A study's report: per arm the mean of each declared metric with its 95% interval over seeds; per declared
comparison the paired difference over the seeds both arms finished, its interval, the p-value Holm-adjusted over
every declared (comparison, metric) test, the minimum detectable effect at 80% power, and a verdict that says
what was measured. Written as report.md and report.json beside the runs, with curves.png (seed bands).

Only finished runs count: a run still training, or one that failed, is listed as missing, and its seed drops
out of the comparisons it is in (a paired test needs both arms at that seed). A finished seed that diverged or
did not train (thinkrl/study/soundness.py) is counted per arm and left out the same way; an arm with no sound seed
gets no verdict. Runs that recorded different torch thread counts are noted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from thinkrl.run.jsonl import read_jsonl
from thinkrl.study import soundness, stats
from thinkrl.study.grid import cells
from thinkrl.study.soundness import DIVERGED, NOT_TRAINED
from thinkrl.study.spec import Metric, Study

ALPHA, POWER = 0.05, 0.8


def measure(study: Study, study_dir: Path) -> dict[str, Any]:
    """From the finished runs: "values" {arm: {metric: {seed: value}}} of the sound seeds, "unsound" {arm: {metric:
    {seed: reason}}} (thinkrl/study/soundness.py), "missing" (the runs not finished, as ARM/seed-K) and "threads"
    {ARM/seed-K: [torch thread counts its steps recorded]}."""
    names = [m.name for m in study.metrics]
    out: dict[str, Any] = {k: {a.name: {n: {} for n in names} for a in study.arms} for k in ("values", "unsound")}
    out["missing"], out["threads"] = [], {}
    for cell in cells(study, study_dir):
        if cell.state != "done":
            out["missing"].append(f"{cell.arm.name}/seed-{cell.seed}")
            continue
        records = read_jsonl(cell.run_dir / "metrics.jsonl")
        out["threads"][f"{cell.arm.name}/seed-{cell.seed}"] = soundness.threads(records)
        for m in study.metrics:
            value, reason = soundness.summarise(records, m)
            if reason is not None:
                out["unsound"][cell.arm.name][m.name][cell.seed] = reason
            elif value is not None:
                out["values"][cell.arm.name][m.name][cell.seed] = value
    return out


def values(study: Study, study_dir: Path) -> tuple[dict[str, dict[str, dict[int, float]]], list[str]]:
    """{arm: {metric: {seed: value}}} of the finished, sound runs, and the runs that are not finished (as ARM/seed-K)."""
    measured = measure(study, study_dir)
    return measured["values"], measured["missing"]


def _compare(t: dict, table: dict, unsound: dict) -> tuple[list[int], list[int], str | None]:
    """(the seeds sound in both arms, the finished seeds left out as unsound in either, why there is no verdict)."""
    a, b, name = t["arm"], t["baseline"], t["metric"].name
    done = {x: set(table[x][name]) | set(unsound[x][name]) for x in (a, b)}
    both = sorted(done[a] & done[b])
    seeds = [s for s in both if s in table[a][name] and s in table[b][name]]
    left_out = [s for s in both if s in unsound[a][name] or s in unsound[b][name]]
    for arm in (a, b):
        if done[arm] and not table[arm][name]:
            why = soundness.counts(unsound[arm][name]) or "never logged"
            return seeds, left_out, f"{name}: no verdict for {a} vs {b}: {arm} has no sound seed ({why}; see the table above)"
    if not both:
        return seeds, left_out, f"{name}: no seed where both {a} and {b} finished"
    if not seeds:
        return seeds, left_out, f"{name}: no verdict for {a} vs {b}: no seed is sound in both ({len(left_out)} left out)"
    return seeds, left_out, None


def analyse(study: Study, study_dir: Path) -> dict[str, Any]:
    """The report's numbers (what report.json holds)."""
    measured = measure(study, study_dir)
    table, unsound, missing = measured["values"], measured["unsound"], measured["missing"]
    arms = {
        arm: {
            name: {**_interval(list(by_seed.values())), "seeds": by_seed, **_reasons(unsound[arm][name])} for name, by_seed in per.items()
        }
        for arm, per in table.items()
    }
    tests = []
    for a, b in study.comparisons:
        for m in study.metrics:
            t: dict[str, Any] = {"arm": a, "baseline": b, "metric": m}
            seeds, t["left_out"], t["why_not"] = _compare(t, table, unsound)
            xa, xb = [table[a][m.name][s] for s in seeds], [table[b][m.name][s] for s in seeds]
            paired = stats.paired_difference(xa, xb) if seeds and not t["why_not"] else None
            mde = stats.minimum_detectable_effect(paired.sd, paired.n, ALPHA, POWER) if paired else math.nan
            tests.append({**t, "seeds": seeds, "paired": paired, "mde": mde})
    adjusted = stats.holm([t["paired"].p if t["paired"] else math.nan for t in tests])
    comparisons = []
    for t, p_holm in zip(tests, adjusted):
        m, paired = t["metric"], t["paired"]
        words = (
            stats.verdict(paired, p_holm, t["mde"], ALPHA, m.higher_is_better, t["arm"], t["baseline"], m.name, POWER)
            if paired
            else t["why_not"]
        )
        if t["left_out"]:
            words += f" [{len(t['left_out'])} finished seed(s) left out: diverged or did not train in either arm]"
        comparisons.append(
            {
                "arm": t["arm"],
                "baseline": t["baseline"],
                "metric": m.name,
                "summary": m.summary,
                "higher_is_better": m.higher_is_better,
                "seeds": t["seeds"],
                "left_out": t["left_out"],
                "paired": paired.to_dict() if paired else None,
                "p_holm": _finite(p_holm),
                "mde": _finite(t["mde"]),
                "verdict": words,
            }
        )
    return {
        "study": study.name,
        "alpha": ALPHA,
        "power": POWER,
        "seeds": list(study.seeds),
        "arms": arms,
        "comparisons": comparisons,
        "missing": missing,
        "threads": measured["threads"],
    }


def _reasons(unsound: dict[int, str]) -> dict[str, list[int]]:
    return {
        "diverged": sorted(s for s, r in unsound.items() if r == DIVERGED),
        "did_not_train": sorted(s for s, r in unsound.items() if r == NOT_TRAINED),
    }


def _interval(xs: list[float]) -> dict[str, Any]:
    return stats.mean_interval(xs).to_dict() if xs else {"mean": None, "lower": None, "upper": None, "n": 0}


def _finite(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _cell(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def markdown(study: Study, result: dict[str, Any]) -> str:
    """report.md: the setup, then the numbers, then the verdicts."""
    lines = [f"# Study {study.name}", ""]
    shared = ", ".join(study.overrides) or "none"
    lines += [
        f"Shared regime: recipe `{study.recipe}`, overrides `{shared}`" + (f", config `{study.config}`" if study.config else "") + "."
    ]
    lines += [f"Seeds: {', '.join(map(str, study.seeds))} (seed k of every arm: the same prompts, order and initial weights).", ""]
    lines += ["| arm | method | overrides |", "|---|---|---|"]
    lines += [f"| {a.name} | {a.method} | {', '.join(a.overrides) or '-'} |" for a in study.arms]
    for m in study.metrics:
        better = {True: "higher is better", False: "lower is better", None: "no better direction"}[m.higher_is_better]
        lines += ["", f"## {m.name} ({_summary_words(m)}; {better})", ""]
        lines += ["| arm | sound seeds | mean | 95% interval | diverged | did not train |", "|---|---|---|---|---|---|"]
        for a in study.arms:
            r = result["arms"][a.name][m.name]
            lines.append(
                f"| {a.name} | {r['n']} | {_cell(r['mean'])} | {_cell(r['lower'])} to {_cell(r['upper'])} | "
                f"{len(r['diverged'])} | {len(r['did_not_train'])} |"
            )
    lines += ["", "## Comparisons (paired over seeds; p Holm-adjusted over every comparison and metric below)", ""]
    lines += [
        "| arm - baseline | metric | pairs | difference | 95% interval | p | Holm p | MDE (80% power) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in result["comparisons"]:
        p = c["paired"] or {}
        lines.append(
            f"| {c['arm']} - {c['baseline']} | {c['metric']} | {len(c['seeds'])}{_left_out(c)} | {_cell(p.get('mean_diff'))} | "
            f"{_cell(p.get('lower'))} to {_cell(p.get('upper'))} | {_cell(p.get('p'))} | {_cell(c['p_holm'])} | {_cell(c['mde'])} |"
        )
    lines += ["", "Verdicts:", ""] + [f"- {c['verdict']}" for c in result["comparisons"]]
    lines += ["", SOUND_NOTE]
    if result["missing"]:
        lines += ["", f"Not finished (left out): {', '.join(result['missing'])}."]
    note = threads_note(result["threads"])
    if note:
        lines += ["", note]
    lines += ["", "Curves: curves.png (mean over seeds with a min-max band).", ""]
    return "\n".join(lines)


SOUND_NOTE = (
    "A seed that did not train (an update skipped as NaN/inf) or diverged (a non-finite final value) is left out of "
    "the means and of every comparison it is in; a comparison uses the seeds sound in both arms."
)


def threads_note(threads: dict[str, list[int]]) -> str:
    """A note when the runs did not all use one torch thread count (CPU numbers can depend on it), else ""."""
    if len({n for counts in threads.values() for n in counts}) < 2:
        return ""
    listed = "; ".join(f"{run}: {', '.join(map(str, counts))}" for run, counts in threads.items() if counts)
    return f"Note: the runs used different torch thread counts (torch/threads), so CPU arithmetic may differ between seeds: {listed}."


def _left_out(c: dict) -> str:
    return f" ({len(c['left_out'])} left out)" if c["left_out"] else ""


def _summary_words(m: Metric) -> str:
    if m.summary == "final":
        return "each run's value at its last logged step"
    if m.summary == "mean":
        return "each run's mean over all steps"
    return f"each run's mean over its last {m.summary.split(':')[1]} logged values"


def write_report(study: Study, study_dir: Path) -> dict[str, Any]:
    """report.json, report.md and curves.png in study_dir; returns the numbers."""
    result = analyse(study, study_dir)
    (study_dir / "report.json").write_text(json.dumps(result, indent=1, default=_json_default, allow_nan=False) + "\n")
    (study_dir / "report.md").write_text(markdown(study, result))
    done = [c.run_dir for c in cells(study, study_dir) if c.state == "done"]
    if done:
        from thinkrl.run.plot import plot_runs
        from thinkrl.run.readers import load_runs

        plot_runs(load_runs(done), study_dir / "curves.png", 1, study.name, [m.name for m in study.metrics])
    return result


def _json_default(x: Any) -> Any:
    if isinstance(x, Metric):
        return x.name
    raise TypeError(f"cannot write {type(x).__name__} to report.json")
