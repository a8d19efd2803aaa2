"""The reproductions' summary tables (docs/reproductions.md), written from the committed results alone.

Each seed paper has one row: the probe or study file that tests it (bench/repro/probes/, bench/repro/studies/),
its primary measure, the comparisons and the direction the paper's claim predicts. A probe's verdict is taken
across its independent starts (thinkrl/probe/report.py): "supported in miniature" when the Holm-adjusted
start-level difference is in the predicted direction, "contradicted in miniature" when against it, else "no
difference detected" with the smallest difference the starts could have detected (80% power). A control row
(a positive control, another setting) gets its own words, never a verdict's. A second table holds each
paper's arm against the no-clip controls (cispo, ratio-weighted REINFORCE) start by start; a third, every
arm's clip fraction beside its cos_ref.

    python bench/repro_summary.py            # print the tables
    python bench/repro_summary.py --write    # replace the generated part of docs/reproductions.md
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: the statistics are thinkrl's own

from thinkrl.probe.report import start_level  # noqa: E402
from thinkrl.study import stats  # noqa: E402

RESULTS = ROOT / "bench" / "repro" / "results"
DOC = ROOT / "docs" / "reproductions.md"
FOLDER = {"probe": "probes", "study": "studies"}  # bench/repro/results/<folder>/<file's stem>/
BEGIN, END = "<!-- summary: begin (bench/repro_summary.py --write) -->", "<!-- summary: end -->"


@dataclass(frozen=True)
class Row:
    paper: str
    kind: str  # probe | study
    file: str  # the probe or study file's stem
    measure: str
    arms: tuple[str, ...]  # the paper's arms, each against `base`
    base: str
    expected: int  # the sign of arm - base the claim predicts
    role: str = "primary"  # primary | control (a positive control) | earlier (a superseded file): own words, no verdict
    controls: tuple[str, ...] = ()  # arms that clip nothing (or sis_all: the test forced): does the arm beat them too?
    interpretation: bool = False  # the method is the project's reading of an abstract, not a paper's code


NO_CLIP = ("cispo", "reinforce")
ROWS = (
    Row("sis", "probe", "sis", "cos_ref", ("sis", "sis_all"), "grpo", +1, controls=(*NO_CLIP, "sis_all")),
    Row("drpo", "probe", "drpo", "cos_ref", ("drpo", "dppo"), "grpo", +1, controls=NO_CLIP),
    Row("ctpo", "probe", "ctpo", "cos_ref", ("ctpo", "ctpo_scaled", "gspo"), "grpo", +1, controls=NO_CLIP),
    Row("stare", "probe", "stare", "entropy_slope", ("stare",), "dapo", +1),
    Row("ais", "probe", "ais", "cos_ref", ("ais", "tis"), "grpo", +1, interpretation=True),
    Row("ais", "probe", "ais-fp4", "cos_ref", ("ais", "tis"), "grpo", +1, role="control", interpretation=True),
    Row("ict", "probe", "ict", "renyi2_slope_unit", ("ict",), "grpo", +1, interpretation=True),
    Row("thinking_seeds", "study", "thinking_seeds_2", "eval/arith/avg@1", ("thinking_seeds",), "grpo", +1, interpretation=True),
    Row("thinking_seeds", "study", "thinking_seeds", "eval/arith/avg@1", ("thinking_seeds",), "grpo", +1, "earlier", interpretation=True),
)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def result(kind: str, name: str) -> dict | None:
    path = RESULTS / FOLDER[kind] / name / ("probe.json" if kind == "probe" else "report.json")
    return json.loads(path.read_text()) if path.is_file() else None


def _comparison(report: dict, kind: str, arm: str, base: str, measure: str) -> dict | None:
    key_arm, key_measure = ("method", "measure") if kind == "probe" else ("arm", "metric")
    return next((c for c in report["comparisons"] if c[key_arm] == arm and c["baseline"] == base and c[key_measure] == measure), None)


def verdict(c: dict, expected: int, role: str) -> str:
    """Primary rows: the declared verdict words on the Holm p. Other rows: a plain description, named by role."""
    p, diff = (c["p_holm"] if role == "primary" else c.get("p")), c["paired"]["mean_diff"]
    if p is None or p > 0.05 or diff == 0:
        return ("no difference detected" if role == "primary" else f"{role}: not distinguished") + f" (could detect {_num(c['mde'])})"
    if role == "primary":
        return "supported in miniature" if diff * expected > 0 else "contradicted in miniature"
    return f"{role}: arm {'above' if diff > 0 else 'below'} baseline"


def regime(kind: str, report: dict) -> str:
    """Start checkpoint, lr, group size, answer length, and which direction the measure is taken of."""
    if kind == "study":
        return "from the base model; 20 AdamW steps, lr 2e-4; G 8; answers <= 48 tokens; held-out accuracy"
    s, begins = report["setting"], report["begins"]
    answer = sum(b.get("answer_tokens", 0) for b in begins) / len(begins)
    start = ", ".join(s.get("start") or ["the model itself"])
    stale = f"{s['stale_updates']} stale AdamW step{'s' if s['stale_updates'] != 1 else ''}"
    answers = f"answers <= {s['max_new_tokens']} (mean {answer:.0f})"
    k3 = sum(b.get("sampler_k3", 0) for b in begins) / len(begins)  # a low-precision sampler's gap to the trainer
    gap = f"; sampler gap {k3:.3f} nats/token (k3)" if k3 > 1e-3 else ""
    return f"start: grpo {start}; lr {s['lr']:g}; G {s['group_size']}; {answers}; {stale}{gap}; plain gradient"


def _cpu_record(kind: str, name: str) -> dict | None:
    path = RESULTS / FOLDER[kind] / name / "cpu.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _cpu(kind: str, name: str) -> str:
    c = _cpu_record(kind, name)
    if c is None:
        return "-"
    minutes = f"{(c['user_s'] + c['sys_s']) / 60:.0f} min"
    if "estimated_s" in c:  # measured in part; the file says how the rest was estimated
        return f"{minutes} ({c['estimated_s'] / 60:.0f} min of it estimated)"
    return f"about {minutes} (estimated)" if "estimate" in c else minutes  # the file says how


def _estimated_s(c: dict) -> float:
    """The estimated part of a cpu.json's user + system seconds: "estimated_s" where only part was estimated,
    all of it where the file says "estimate" alone, none where it was measured."""
    return c.get("estimated_s", c["user_s"] + c["sys_s"] if "estimate" in c else 0.0)


def total_cpu() -> str:
    """The CPU time of every row's committed result, measured and estimated apart."""
    measured = estimated = 0.0
    for row in ROWS:
        c = _cpu_record(row.kind, row.file)
        if c is not None:
            part = _estimated_s(c)
            estimated, measured = estimated + part, measured + c["user_s"] + c["sys_s"] - part
    return (
        f"Total CPU (user + system) of the results above: {(measured + estimated) / 3600:.1f} h, of which "
        f"{measured / 3600:.1f} h measured and {estimated / 3600:.1f} h estimated (each result's cpu.json says how)."
    )


def _size(kind: str, report: dict, c: dict) -> str:
    if kind == "study":
        return f"{c['paired']['n']} seeds"
    return f"{report['starts']} x {min(report['replicates'])}" + ("" if len(set(report["replicates"])) == 1 else "+")


def _line(row: Row, arm: str) -> str | None:
    report = result(row.kind, row.file)
    c = _comparison(report, row.kind, arm, row.base, row.measure) if report else None
    if c is None:
        return None
    p, primary = c["paired"], row.role == "primary"
    pv = c["p_holm"] if primary else c.get("p", c["paired"].get("p"))  # a study's report keeps p in "paired"
    sd = c.get("between_start_sd")
    paper = f"{row.paper} (INTERPRETATION)" if row.interpretation else row.paper
    cmd = f"`thinkrl {row.kind} bench/repro/{FOLDER[row.kind]}/{row.file}.yaml`"
    return (
        f"| {paper} | {row.role} | {row.measure} | {arm} - {row.base} | {_size(row.kind, report, c)} | "
        f"{_num(p['mean_diff'])} [{_num(p['lower'])}, {_num(p['upper'])}] | {_num(sd)} | {_num(pv)}{'' if primary else ' (unadjusted)'} | "
        f"{verdict(c, row.expected, row.role)} | {_num(c['mde'])} | {regime(row.kind, report)} | {_cpu(row.kind, row.file)} | {cmd} |"
    )


def table() -> str:
    head = [
        "| paper | role | measure (declared) | comparison | starts x replicates (or seeds) | difference [95% CI across starts] "
        "| sd between starts | Holm p | verdict | MDE (80%) | regime | CPU | rerun |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines = []
    for row in ROWS:
        got = [g for g in (_line(row, a) for a in row.arms) if g]
        lines += got or [f"| {row.paper} | {row.role} | {row.measure} | - | - | - | - | - | pending: no results yet | - | - | - | - |"]
    return "\n".join([*head, *lines, "", total_cpu()])


def control(report: dict, arm: str, other: str, measure: str) -> dict | None:
    """arm - other, start by start (each start's mean over its replicates), with its t interval: unadjusted."""
    a, b = start_level(report["raw"], arm, other, measure)
    if len(a) < 2:
        return None
    d = stats.paired_difference(a, b)
    return {"paired": d.to_dict(), "mde": stats.minimum_detectable_effect(d.sd, d.n)}


def survives(c: dict, expected: int) -> str:
    lo, hi = c["paired"]["lower"], c["paired"]["upper"]
    if lo is None or hi is None:
        return "undefined (no spread)"
    if (lo > 0 and expected > 0) or (hi < 0 and expected < 0):
        return "yes: beyond the control"
    if (hi < 0 and expected > 0) or (lo > 0 and expected < 0):
        return "no: the control does better"
    return f"no: not distinguished from the control (could detect {_num(c['mde'])})"


def controls_table() -> str:
    lines = ["| paper | arm - control | measure | starts | difference [95% CI across starts] | survives? |", "|---|---|---|---|---|---|"]
    for row in ROWS:
        report = result(row.kind, row.file) if row.controls else None
        for arm in row.arms if report else ():
            for other in (o for o in row.controls if o != arm):
                c = control(report, arm, other, row.measure)
                if c is not None:
                    p = c["paired"]
                    lines.append(f"| {row.paper} | {arm} - {other} | {row.measure} | {p['n']} | {_num(p['mean_diff'])} "
                                 f"[{_num(p['lower'])}, {_num(p['upper'])}] | {survives(c, row.expected)} |")  # fmt: skip
    return "\n".join(lines)


def arms_table() -> str:
    """Every probed arm's mean cos_ref, clip fraction and gradient norm (over start means)."""
    lines = ["| file | arm | cos_ref | clip_frac | grad_norm | what the method reported |", "|---|---|---|---|---|---|"]
    for row in ROWS:
        report = result(row.kind, row.file) if row.kind == "probe" else None
        for arm, per in report["methods"].items() if report else ():
            mean = {k: _num(per.get(k) and per[k]["mean"]) for k in ("cos_ref", "clip_frac", "grad_norm")}
            extra = ", ".join(f"{k} {v:.3g}" for k, v in report.get("method_metrics", {}).get(arm, {}).items() if not k.startswith("clip/"))
            lines.append(f"| {row.file} | {arm} | {mean['cos_ref']} | {mean['clip_frac']} | {mean['grad_norm']} | {extra or '-'} |")
    return "\n".join(lines)


def document() -> str:
    return "\n\n".join([
        table(),
        "### Against the no-clip controls (start level, unadjusted)",
        controls_table(),
        "### Each arm: direction, clipping and length (means over start means)",
        arms_table(),
    ])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace the generated tables in docs/reproductions.md")
    args = ap.parse_args()
    text = document()
    if not args.write:
        print(text)
        return
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
