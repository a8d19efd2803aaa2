"""The probe's summary, with the starting point as the unit of evidence.

A start (its own start run, stale batch, reference and replicates) is one draw of everything a single probe
holds fixed; its replicates resample mini-batches only. So the verdict is taken across starts: per start the
mean paired difference (arm - baseline) over its replicates, then a paired t interval over those means with
n = starts, Holm over the primary (arm, measure) tests, and the minimum detectable effect at that level. The
replicate-level intervals within each start are kept as a secondary view, with the spread between starts.
With one start there is no between-start spread to test against: the comparison falls back to the
replicates of that start, and says that it is about that start alone. Written as probe.json and probe.md.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from thinkrl.study import stats

MEASURES = {
    "entropy_slope": "dH/d(lr) of a plain step along the update (first order)",
    "cos_ref": "cosine of the update with the on-policy reference gradient",
    "kl_slope": "dKL(start || policy)/d(lr) of a plain step along the update (first order)",
    "grad_norm": "norm of the loss gradient",
    "clip_frac": "share of tokens clipped or masked (as the method reports it)",
    "entropy_slope_unit": "entropy_slope / grad_norm: the entropy change along a unit-length step in the update's direction",
    "renyi2_slope": "dH2/d(lr) of a plain step, H2 = -log sum p^2 the Renyi-2 entropy (measured when a probe asks for it)",
    "renyi2_slope_unit": "renyi2_slope / grad_norm: the Renyi-2 entropy change along a unit-length step",
}
RENYI = ("renyi2_slope", "renyi2_slope_unit")  # measures that need the extra reference pass


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _pairs(reps: list[dict[str, dict]], arm: str, base: str, k: str) -> list[tuple[float, float]]:
    """(arm, baseline) values of measure k over the replicates where both have one (a cosine needs a gradient)."""
    return [(r[arm][k], r[base][k]) for r in reps if r[arm].get(k) is not None and r[base].get(k) is not None]


def start_level(starts: list[list[dict[str, dict]]], arm: str, base: str, k: str) -> tuple[list[float], list[float]]:
    """Per start with at least one pair: the mean of the arm's and of the baseline's values over its pairs."""
    a, b = [], []
    for reps in starts:
        pairs = _pairs(reps, arm, base, k)
        if pairs:
            a.append(_mean([x for x, _ in pairs]))
            b.append(_mean([y for _, y in pairs]))
    return a, b


def _test(starts: list[list[dict[str, dict]]], arm: str, base: str, k: str) -> dict[str, Any] | None:
    """One (arm, measure) comparison: across starts when there are two or more, else over one start's replicates."""
    within = [stats.paired_difference(*zip(*p)) for p in (_pairs(reps, arm, base, k) for reps in starts) if len(p) >= 2]
    if len(starts) > 1:
        a, b = start_level(starts, arm, base, k)
        unit = "starts"
    else:
        pairs = _pairs(starts[0], arm, base, k)
        a, b, unit = [x for x, _ in pairs], [y for _, y in pairs], "replicates of one start"
    if len(a) < 2:
        return None
    d = stats.paired_difference(a, b)
    diffs = [x - y for x, y in zip(a, b)]
    return {"method": arm, "baseline": base, "measure": k, "paired": d, "mde": stats.minimum_detectable_effect(d.sd, d.n),
            "unit": unit, "between_start_sd": statistics.stdev(diffs) if len(starts) > 1 and len(diffs) > 1 else None,
            "within_start": [w.to_dict() for w in within]}  # fmt: skip


def summarise(starts: list[list[dict[str, dict]]], methods: list[str], primary: tuple[str, ...] = ()) -> dict[str, Any]:
    """`starts`: each start's replicates (each replicate: arm label -> measures); `methods`: the arm labels, the
    first the baseline; `primary`: the measures Holm adjusts over (empty: all)."""
    primary = primary or tuple(MEASURES)
    measured = [k for k in MEASURES if any(r[m].get(k) is not None for reps in starts for r in reps for m in methods)]
    per: dict[str, dict[str, Any]] = {}
    for m in methods:  # the arm's own mean: over start means (or one start's replicates)
        per[m] = {}
        for k in measured:
            means = [_mean(xs) for xs in ([r[m][k] for r in reps if r[m].get(k) is not None] for reps in starts) if xs]
            xs = means if len(starts) > 1 else [r[m][k] for r in starts[0] if r[m].get(k) is not None]
            per[m][k] = stats.mean_interval(xs).to_dict() if xs else None
    tests = [t for m in methods[1:] for k in measured if (t := _test(starts, m, methods[0], k)) is not None]
    first = [t for t in tests if t["measure"] in primary]
    adjusted = dict(zip(map(id, first), stats.holm([t["paired"].p for t in first])))
    comparisons = []
    for t in tests:
        role = "primary" if id(t) in adjusted else "secondary"
        p = adjusted.get(id(t), t["paired"].p)
        words = stats.verdict(t["paired"], p, t["mde"], 0.05, None, t["method"], t["baseline"], t["measure"], unit=t["unit"])
        if role == "secondary":  # its own p: the adjustment covers the primary tests alone
            words = "secondary, not adjusted: " + words.replace("Holm-adjusted p", "p")
        comparisons.append({**t, "paired": t["paired"].to_dict(), "role": role, "p_holm": _finite(p) if role == "primary" else None,
                            "p": _finite(t["paired"].p), "mde": _finite(t["mde"]), "verdict": words})  # fmt: skip
    return {"starts": len(starts), "replicates": [len(reps) for reps in starts], "primary": list(primary),
            "level": "start" if len(starts) > 1 else "replicate", "methods": per, "comparisons": comparisons,
            "method_metrics": _method_metrics(starts, methods)}  # fmt: skip


def _method_metrics(starts: list[list[dict[str, dict]]], methods: list[str]) -> dict[str, dict[str, float]]:
    """Each arm's own reported metrics (ais's alpha, sis's acceptance...) averaged over every replicate."""
    out: dict[str, dict[str, float]] = {}
    for m in methods:
        keys = sorted({k for reps in starts for r in reps for k in r[m].get("metrics", {})})
        out[m] = {k: _mean([r[m]["metrics"][k] for reps in starts for r in reps if k in r[m].get("metrics", {})]) for k in keys}
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _c(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def markdown(summary: dict[str, Any], setting: dict[str, Any], begins: list[dict[str, Any]]) -> str:
    level = "start means" if summary["level"] == "start" else "the replicates of one start"
    lines = ["# One-step probe", "", "Setting: " + ", ".join(f"{k}={v}" for k, v in setting.items()), "",
             f"{summary['starts']} start(s), replicates per start: {summary['replicates']}. Intervals below are over {level}.", "",
             "| start | seed | KL(start -> probed) | log-ratio sd | sampler k3 | answer tokens | reward |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for i, b in enumerate(begins):
        lines.append(f"| {i} | {b.get('seed')} | {_c(b.get('kl_start_to_probed'))} | {_c(b.get('log_ratio_sd'))} | "
                     f"{_c(b.get('sampler_k3'))} | {_c(b.get('answer_tokens'))} | {_c(b.get('reward_mean'))} |")  # fmt: skip
    lines.append("")
    for k, what in MEASURES.items():
        if not any(per.get(k) for per in summary["methods"].values()):
            continue
        lines += [f"## {k}: {what}", "", "| method | n | mean | 95% interval |", "|---|---|---|---|"]
        for m, per in summary["methods"].items():
            r = per.get(k)
            lines.append(f"| {m} | {r['n'] if r else 0} | {_c(r and r['mean'])} | {_c(r and r['lower'])} to {_c(r and r['upper'])} |")
        lines.append("")
    lines += ["## Paired differences (Holm-adjusted over the primary rows; secondary rows give their own p)", "",
              "| method - baseline | measure | role | n | difference | 95% interval | p (Holm for primary) | MDE (80%) "
              "| sd between starts |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in summary["comparisons"]:
        p, shown = c["paired"], c["p_holm"] if c["role"] == "primary" else c["p"]
        lines.append(
            f"| {c['method']} - {c['baseline']} | {c['measure']} | {c['role']} | {p['n']} {c['unit']} | {_c(p['mean_diff'])} | "
            f"{_c(p['lower'])} to {_c(p['upper'])} | {_c(shown)} | {_c(c['mde'])} | {_c(c['between_start_sd'])} |"
        )
    lines += ["", "## Within each start (replicate-level, secondary: each is about its own start)", "",
              "| method - baseline | measure | per start: difference [95% interval] |", "|---|---|---|"]  # fmt: skip
    for c in summary["comparisons"]:
        cells = "; ".join(f"{_c(w['mean_diff'])} [{_c(w['lower'])}, {_c(w['upper'])}]" for w in c["within_start"])
        lines.append(f"| {c['method']} - {c['baseline']} | {c['measure']} | {cells} |")
    if any(summary["method_metrics"].values()):
        lines += ["", "## What each method reported (mean over every replicate)", ""]
        lines += [f"- {m}: " + ", ".join(f"{k}={v:.4g}" for k, v in ms.items()) for m, ms in summary["method_metrics"].items() if ms]
    return "\n".join(lines + ["", "Verdicts:", ""] + [f"- {c['verdict']}" for c in summary["comparisons"]]) + "\n"


def write(out: Path, summary: dict[str, Any], setting: dict[str, Any], begins: list[dict[str, Any]], starts: list[list[dict]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record = {"setting": setting, "begins": begins, **summary, "raw": starts}
    (out / "probe.json").write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
    (out / "probe.md").write_text(markdown(summary, setting, begins))
