"""A study's report: per arm the mean of each declared metric with its 95% interval over seeds; per declared
comparison the paired difference over the seeds both arms finished, its interval, the p-value Holm-adjusted over
every declared (comparison, metric) test, the minimum detectable effect at 80% power, and a verdict that says
what was measured. Written as report.md and report.json beside the runs, with curves.png (seed bands).

Only finished runs count: a run still training, or one that failed, is listed as missing, and its seed drops
out of the comparisons it is in (a paired test needs both arms at that seed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from thinkrl.run.jsonl import read_jsonl
from thinkrl.study import stats
from thinkrl.study.grid import cells
from thinkrl.study.spec import Metric, Study

ALPHA, POWER = 0.05, 0.8


def values(study: Study, study_dir: Path) -> tuple[dict[str, dict[str, dict[int, float]]], list[str]]:
    """{arm: {metric: {seed: value}}} from the finished runs, and the runs that are not (as ARM/seed-K)."""
    out: dict[str, dict[str, dict[int, float]]] = {a.name: {m.name: {} for m in study.metrics} for a in study.arms}
    missing = []
    for cell in cells(study, study_dir):
        if cell.state != "done":
            missing.append(f"{cell.arm.name}/seed-{cell.seed}")
            continue
        records = read_jsonl(cell.run_dir / "metrics.jsonl")
        for m in study.metrics:
            series = [float(r[m.name]) for r in records if isinstance(r.get(m.name), (int, float)) and math.isfinite(r[m.name])]
            value = m.of(series)
            if value is not None:
                out[cell.arm.name][m.name][cell.seed] = value
    return out, missing


def analyse(study: Study, study_dir: Path) -> dict[str, Any]:
    """The report's numbers (what report.json holds)."""
    table, missing = values(study, study_dir)
    arms = {
        arm: {name: {**_interval(list(by_seed.values())), "seeds": by_seed} for name, by_seed in per.items()} for arm, per in table.items()
    }
    tests = []
    for a, b in study.comparisons:
        for m in study.metrics:
            seeds = sorted(set(table[a][m.name]) & set(table[b][m.name]))
            xa, xb = [table[a][m.name][s] for s in seeds], [table[b][m.name][s] for s in seeds]
            paired = stats.paired_difference(xa, xb) if seeds else None
            mde = stats.minimum_detectable_effect(paired.sd, paired.n, ALPHA, POWER) if paired else math.nan
            tests.append({"arm": a, "baseline": b, "metric": m, "seeds": seeds, "paired": paired, "mde": mde})
    adjusted = stats.holm([t["paired"].p if t["paired"] else math.nan for t in tests])
    comparisons = []
    for t, p_holm in zip(tests, adjusted):
        m, paired = t["metric"], t["paired"]
        words = (
            stats.verdict(paired, p_holm, t["mde"], ALPHA, m.higher_is_better, t["arm"], t["baseline"], m.name, POWER)
            if paired
            else f"{m.name}: no seed where both {t['arm']} and {t['baseline']} finished"
        )
        comparisons.append(
            {
                "arm": t["arm"],
                "baseline": t["baseline"],
                "metric": m.name,
                "summary": m.summary,
                "higher_is_better": m.higher_is_better,
                "seeds": t["seeds"],
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
        lines += ["| arm | seeds | mean | 95% interval |", "|---|---|---|---|"]
        for a in study.arms:
            r = result["arms"][a.name][m.name]
            lines.append(f"| {a.name} | {r['n']} | {_cell(r['mean'])} | {_cell(r['lower'])} to {_cell(r['upper'])} |")
    lines += ["", "## Comparisons (paired over seeds; p Holm-adjusted over every comparison and metric below)", ""]
    lines += [
        "| arm - baseline | metric | pairs | difference | 95% interval | p | Holm p | MDE (80% power) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in result["comparisons"]:
        p = c["paired"] or {}
        lines.append(
            f"| {c['arm']} - {c['baseline']} | {c['metric']} | {len(c['seeds'])} | {_cell(p.get('mean_diff'))} | "
            f"{_cell(p.get('lower'))} to {_cell(p.get('upper'))} | {_cell(p.get('p'))} | {_cell(c['p_holm'])} | {_cell(c['mde'])} |"
        )
    lines += ["", "Verdicts:", ""] + [f"- {c['verdict']}" for c in result["comparisons"]]
    if result["missing"]:
        lines += ["", f"Not finished (left out): {', '.join(result['missing'])}."]
    lines += ["", "Curves: curves.png (mean over seeds with a min-max band).", ""]
    return "\n".join(lines)


def _summary_words(m: Metric) -> str:
    if m.summary == "final":
        return "each run's last logged value"
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
