"""The probe's summary: per method the mean of each measure over replicates with its 95% interval; per method
against the first one the paired difference (replicates share their mini-batch) with the minimum detectable
effect, Holm-adjusted over the (method, measure) tests of the primary measures (a probe file declares them;
otherwise every measure is primary). Tests of the other measures are secondary: reported with their
unadjusted p and marked so. Written as probe.json and probe.md."""

from __future__ import annotations

import json
import math
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
}


def summarise(results: list[dict[str, dict]], methods: list[str], primary: tuple[str, ...] = ()) -> dict[str, Any]:
    """`methods`: the labels of results' arms, the first the baseline; `primary`: the measures Holm adjusts
    over (empty: all)."""
    primary = primary or tuple(MEASURES)
    per: dict[str, dict[str, Any]] = {}
    for m in methods:
        per[m] = {}
        for k in MEASURES:
            xs = [r[m][k] for r in results if r[m].get(k) is not None]
            per[m][k] = stats.mean_interval(xs).to_dict() if xs else None
    base, tests = methods[0], []
    for m in methods[1:]:
        for k in MEASURES:
            pairs = [(r[m][k], r[base][k]) for r in results if r[m].get(k) is not None and r[base].get(k) is not None]
            if len(pairs) >= 2:
                d = stats.paired_difference([a for a, _ in pairs], [b for _, b in pairs])
                tests.append({"method": m, "baseline": base, "measure": k, "paired": d, "mde": stats.minimum_detectable_effect(d.sd, d.n)})
    first = [t for t in tests if t["measure"] in primary]
    adjusted = dict(zip(map(id, first), stats.holm([t["paired"].p for t in first])))
    comparisons = []
    for t in tests:
        role = "primary" if id(t) in adjusted else "secondary"
        p = adjusted.get(id(t), t["paired"].p)
        words = stats.verdict(t["paired"], p, t["mde"], 0.05, None, t["method"], t["baseline"], t["measure"], unit="replicates")
        if role == "secondary":  # its own p: the adjustment covers the primary tests alone
            words = "secondary, not adjusted: " + words.replace("Holm-adjusted p", "p")
        comparisons.append({**t, "paired": t["paired"].to_dict(), "role": role, "p_holm": _finite(p) if role == "primary" else None,
                            "p": _finite(t["paired"].p), "mde": _finite(t["mde"]), "verdict": words})  # fmt: skip
    return {"replicates": len(results), "primary": list(primary), "methods": per, "comparisons": comparisons}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _c(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def markdown(summary: dict[str, Any], setting: dict[str, Any]) -> str:
    lines = ["# One-step probe", "", "Setting: " + ", ".join(f"{k}={v}" for k, v in setting.items()), ""]
    for k, what in MEASURES.items():
        lines += [f"## {k}: {what}", "", "| method | replicates | mean | 95% interval |", "|---|---|---|---|"]
        for m, per in summary["methods"].items():
            r = per[k]
            lines.append(f"| {m} | {r['n'] if r else 0} | {_c(r and r['mean'])} | {_c(r and r['lower'])} to {_c(r and r['upper'])} |")
        lines.append("")
    lines += ["## Paired differences (Holm-adjusted over the primary rows; secondary rows give their own p)", ""]
    lines += ["| method - baseline | measure | role | difference | 95% interval | p (Holm for primary) | MDE (80%) |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in summary["comparisons"]:
        p, role = c["paired"], c.get("role", "primary")
        shown = c["p_holm"] if role == "primary" else c["p"]
        lines.append(
            f"| {c['method']} - {c['baseline']} | {c['measure']} | {role} | {_c(p['mean_diff'])} | "
            f"{_c(p['lower'])} to {_c(p['upper'])} | {_c(shown)} | {_c(c['mde'])} |"
        )
    return "\n".join(lines + ["", "Verdicts:", ""] + [f"- {c['verdict']}" for c in summary["comparisons"]]) + "\n"


def write(out: Path, summary: dict[str, Any], setting: dict[str, Any], results: list[dict[str, dict]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps({"setting": setting, **summary, "raw": results}, indent=1, allow_nan=False) + "\n")
    (out / "probe.md").write_text(markdown(summary, setting))
