"""The powered reproductions' summary table (docs/reproductions.md), written from the committed results alone.

Each seed paper has one declared row: the probe or study file that tests it (bench/repro/probes/,
bench/repro/studies/), its primary measure, the comparisons and the direction the paper's claim predicts, all
fixed before the runs. A row's verdict says only this: the Holm-adjusted paired difference of the primary
measure is in the predicted direction ("supported in miniature"), against it ("contradicted in miniature"),
or not detected, with the smallest difference the replicates or seeds could have detected (80% power).

    python bench/repro_summary.py            # print the tables
    python bench/repro_summary.py --write    # replace the generated part of docs/reproductions.md
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
    comparisons: tuple[tuple[str, str], ...]  # (arm, baseline) as the report names them
    expected: int  # the sign of arm - baseline the claim predicts
    secondary_files: tuple[str, ...] = ()  # same comparisons, other settings (e.g. staleness), not adjusted with the primary


ROWS = (
    Row("ctpo", "probe", "ctpo", "cos_ref", (("grpo", "ctpo"), ("gspo", "ctpo")), -1, ("ctpo-stale1",)),
    Row("sis", "probe", "sis", "cos_ref", (("sis", "grpo"),), +1, ("sis-stale2", "sis-stale8")),
    Row("stare", "probe", "stare", "entropy_slope", (("stare", "dapo"),), +1),
    Row("ais", "probe", "ais", "cos_ref", (("ais", "grpo"), ("tis", "grpo")), +1),
    Row("drpo", "probe", "drpo", "cos_ref", (("dppo", "drpo"), ("grpo", "drpo")), -1),
    Row("ict", "probe", "ict", "entropy_slope_unit", (("ict", "grpo"),), +1),
    Row("thinking_seeds", "study", "thinking_seeds", "eval/arith/avg@1", (("thinking_seeds", "grpo"),), +1),
)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _result(kind: str, name: str) -> dict | None:
    path = RESULTS / FOLDER[kind] / name / ("probe.json" if kind == "probe" else "report.json")
    return json.loads(path.read_text()) if path.is_file() else None


def _comparison(report: dict, kind: str, arm: str, base: str, measure: str) -> dict | None:
    key_arm, key_measure = ("method", "measure") if kind == "probe" else ("arm", "metric")
    return next(
        (c for c in report["comparisons"] if c[key_arm] == arm and c["baseline"] == base and c[key_measure] == measure),
        None,
    )


def _verdict(c: dict, expected: int, adjusted: bool = True) -> str:
    p = c["p_holm"] if adjusted else c.get("p")
    diff = c["paired"]["mean_diff"]
    if p is None or p > 0.05 or diff == 0:
        return f"no difference detected (could detect {_num(c['mde'])})"
    return "supported in miniature" if diff * expected > 0 else "contradicted in miniature"


def _cpu_record(kind: str, name: str) -> dict | None:
    path = RESULTS / FOLDER[kind] / name / "cpu.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _cpu(kind: str, name: str) -> str:
    c = _cpu_record(kind, name)
    if c is None:
        return "-"
    minutes = f"{(c['user_s'] + c['sys_s']) / 60:.0f} min"
    return f"about {minutes} (estimated)" if "estimate" in c else minutes  # the file says how


def total_cpu() -> str:
    """The CPU time of every declared file's committed result, measured and estimated apart."""
    measured = estimated = 0.0
    for row in ROWS:
        for name in (row.file, *row.secondary_files):
            c = _cpu_record(row.kind, name)
            if c is None:
                continue
            if "estimate" in c:
                estimated += c["user_s"] + c["sys_s"]
            else:
                measured += c["user_s"] + c["sys_s"]
    return (
        f"Total CPU (user + system) of the results above: {(measured + estimated) / 3600:.1f} h, of which "
        f"{measured / 3600:.1f} h measured and {estimated / 3600:.1f} h estimated (each result's cpu.json says how)."
    )


def _line(row: Row, name: str, kind: str, arm: str, base: str, role: str) -> str | None:
    report = _result(kind, name)
    c = _comparison(report, kind, arm, base, row.measure) if report else None
    if c is None:
        return None
    p = c["paired"]
    adjusted = role == "primary"
    pv = c["p_holm"] if adjusted else c.get("p")
    cmd = f"`thinkrl {kind} bench/repro/{FOLDER[kind]}/{name}.yaml`"
    return (
        f"| {row.paper} | {role} | {row.measure} | {arm} - {base} | {_num(p['mean_diff'])} [{_num(p['lower'])}, {_num(p['upper'])}] | "
        f"{p['n']} | {_num(pv)}{'' if adjusted else ' (unadjusted)'} | {_verdict(c, row.expected, adjusted)} | {_num(c['mde'])} | "
        f"{_cpu(kind, name)} | {cmd} |"
    )


def table() -> str:
    head = [
        "| paper | role | measure (declared) | comparison | paired difference [95% CI] | n | Holm p | verdict | MDE (80%) | CPU | rerun |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines = []
    for row in ROWS:
        primary = [g for g in (_line(row, row.file, row.kind, a, b, "primary") for a, b in row.comparisons) if g]
        secondary = [_line(row, f, row.kind, a, b, "secondary") for f in row.secondary_files for a, b in row.comparisons]
        lines += primary or [f"| {row.paper} | primary | {row.measure} | - | - | - | - | pending: no results yet | - | - | - |"]
        lines += [g for g in secondary if g]
    return "\n".join([*head, *lines, "", total_cpu()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace the generated table in docs/reproductions.md")
    args = ap.parse_args()
    text = table()
    if not args.write:
        print(text)
        return
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
