"""bench/repro_summary.py: each row's verdict from probe reports built by the probe's own summary over hand-made
starts (supported, against the claim, not detected with its MDE; control rows in their own words), the no-clip
control table start by start, missing results, and the doc's generated part."""

import json
import sys
from pathlib import Path

import pytest

from thinkrl.probe.report import summarise

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import repro_summary as rs  # noqa: E402

SETTING = {"start": ["train.steps=5"], "lr": 2e-4, "group_size": 4, "max_new_tokens": 48, "stale_updates": 4}


def starts(values: dict[str, list[list[float]]], measure: str = "cos_ref") -> list[list[dict]]:
    """values[arm][start] = that start's replicate values: the raw form probe.json holds."""
    arms = list(values)
    n_starts, n_reps = len(values[arms[0]]), len(values[arms[0]][0])
    return [[{a: {measure: values[a][s][r]} for a in arms} for r in range(n_reps)] for s in range(n_starts)]


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "RESULTS", tmp_path)

    def put(kind, name, report, cpu=None):
        d = tmp_path / rs.FOLDER[kind] / name
        d.mkdir(parents=True)
        (d / ("probe.json" if kind == "probe" else "report.json")).write_text(json.dumps(report))
        if cpu:
            (d / "cpu.json").write_text(json.dumps(cpu))

    def probe(name, values, primary, measure="cos_ref", cpu=None):
        raw = starts(values, measure)
        begins = [{"answer_tokens": 30.0}] * len(raw)
        put("probe", name, {**summarise(raw, list(values), primary), "setting": SETTING, "begins": begins, "raw": raw}, cpu)

    return put, probe


# three starts of two replicates: sis beats grpo at every start; cispo gains as much as sis; reinforce less
SIS = {
    "grpo": [[0.10, 0.12], [0.05, 0.07], [0.20, 0.18]],
    "sis": [[0.20, 0.21], [0.15, 0.16], [0.30, 0.29]],
    "sis_all": [[0.19, 0.22], [0.14, 0.18], [0.31, 0.27]],
    "cispo": [[0.21, 0.19], [0.13, 0.18], [0.32, 0.26]],
    "reinforce": [[0.12, 0.13], [0.06, 0.08], [0.21, 0.20]],
}


def test_a_row_gives_the_start_level_verdict_its_regime_and_whether_it_survives_the_controls(results):
    _, probe = results
    probe("sis", SIS, ("cos_ref",), cpu={"user_s": 600, "sys_s": 60})
    text = rs.table()
    sis = next(line for line in text.splitlines() if line.startswith("| sis | primary | cos_ref | sis - grpo"))
    assert "| 3 x 2 |" in sis and "supported in miniature" in sis and "| 11 min |" in sis  # user + system
    assert "start: grpo train.steps=5; lr 0.0002; G 4; answers <= 48 (mean 30); 4 stale AdamW steps; plain gradient" in sis
    controls = rs.controls_table().splitlines()
    cispo = next(line for line in controls if "sis - cispo" in line)
    assert "no: not distinguished from the control" in cispo  # cispo gained as much: not the test's doing
    reinforce = next(line for line in controls if "sis - reinforce" in line)
    # per start: sis 0.205, 0.155, 0.295 against reinforce 0.125, 0.07, 0.205: +0.08, +0.085, +0.09
    assert "| 3 | 0.085 [" in reinforce and "yes: beyond the control" in reinforce
    arms = rs.arms_table()
    assert "| sis | grpo | 0.12 |" in arms  # (0.11 + 0.06 + 0.19) / 3


def test_verdict_words_primary_against_the_claim_not_detected_and_control_rows(results):
    _, probe = results
    flat = {"grpo": [[0.1, 0.3], [0.2, 0.1], [0.3, 0.2]], "ais": [[0.3, 0.1], [0.1, 0.2], [0.2, 0.3]]}
    flat["tis"] = [[x - 0.05 for x in s] for s in flat["grpo"]]  # below grpo by 0.05 at every start: no spread
    probe("ais", flat, ("cos_ref",))
    probe("ais-fp4", {**flat, "tis": [[x + 0.05 for x in s] for s in flat["grpo"]]}, ("cos_ref",))
    text = rs.table().splitlines()
    ais = [line for line in text if line.startswith("| ais (INTERPRETATION) | primary")]
    assert "no difference detected (could detect" in ais[0]  # ais - grpo: differences 0, 0, 0... with spread
    assert "contradicted in miniature" in ais[1]  # tis - grpo = -0.05 at every start
    control = [line for line in text if line.startswith("| ais (INTERPRETATION) | control")]
    assert "control: arm above baseline" in control[1] and "(unadjusted)" in control[1]
    assert not any("supported" in line or "contradicted" in line for line in control)  # a control has no verdict
    assert "| ctpo | primary | cos_ref | - |" in "\n".join(text) and "pending: no results yet" in "\n".join(text)


def test_a_study_row_and_the_cpu_total(results):
    put, _ = results
    c = {"arm": "thinking_seeds", "metric": "eval/arith/avg@1", "baseline": "grpo", "p_holm": 0.3, "p": 0.3, "mde": 0.1,
         "paired": {"mean_diff": -0.04, "lower": -0.11, "upper": 0.04, "n": 12}}  # fmt: skip
    put("study", "thinking_seeds", {"comparisons": [c]}, {"user_s": 1700, "sys_s": 100, "estimate": "how"})
    primary, earlier = [line for line in rs.table().splitlines() if line.startswith("| thinking_seeds")]
    assert "| primary |" in primary and "pending: no results yet" in primary  # the re-declared study has not run
    assert (
        "| 12 seeds |" in earlier and "earlier: not distinguished (could detect 0.1)" in earlier and "about 30 min (estimated)" in earlier
    )
    assert "0.5 h, of which 0.0 h measured and 0.5 h estimated" in rs.total_cpu()
    # a result measured in part: only its estimated seconds count as estimated
    part = {"user_s": 5000, "sys_s": 400, "estimate": "how", "estimated_s": 1800}
    put("study", "thinking_seeds_2", {"comparisons": [{**c, "p_holm": 0.01}]}, part)
    primary = next(line for line in rs.table().splitlines() if line.startswith("| thinking_seeds (INTERPRETATION) | primary"))
    assert "| 90 min (30 min of it estimated) |" in primary
    assert "2.0 h, of which 1.0 h measured and 1.0 h estimated" in rs.total_cpu()  # estimated 1800 + 1800 s, measured 5400 - 1800 s


def test_write_replaces_only_the_generated_part(results, tmp_path, monkeypatch):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{rs.BEGIN}\nold table\n{rs.END}\nafter\n")
    monkeypatch.setattr(rs, "DOC", doc)
    monkeypatch.setattr(sys, "argv", ["repro_summary.py", "--write"])
    monkeypatch.setattr(rs, "ROOT", tmp_path)
    rs.main()
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{rs.END}\nafter\n") and "old table" not in text and "| paper |" in text


def test_every_row_names_a_file_in_the_repo_that_loads_with_its_arms_controls_and_measure():
    """A reader reruns a row from its file: each file loads, its methods build and can be probed, it has the
    row's arms, baseline (its first arm) and controls, and declares the row's measure primary."""
    from thinkrl.probe.measure import check_method
    from thinkrl.probe.spec import load_probe_file
    from thinkrl.study.spec import load_study

    for row in rs.ROWS:
        path = BENCH / "repro" / rs.FOLDER[row.kind] / f"{row.file}.yaml"
        if row.kind == "probe":
            pf = load_probe_file(path)
            for arm in pf.arms:
                check_method(arm.resolved(48, 0.1).build())  # {drift: f} values: at some drift
            labels, declared = [a.label for a in pf.arms], pf.primary
            assert labels[0] == row.base and set(row.arms) | set(row.controls) <= set(labels), (row.file, labels)
            assert pf.settings.get("starts", 1) >= 5, row.file  # every primary row rests on 5 or more starts
        else:
            study = load_study(path)
            pairs, declared = set(study.comparisons), tuple(m.name for m in study.metrics)
            assert {(a, row.base) for a in row.arms} <= pairs, (row.file, pairs)
        assert row.measure in declared, (row.file, row.measure, declared)


def test_the_committed_summary_is_the_one_the_committed_results_give():
    doc = rs.DOC.read_text()
    generated = doc[doc.index(rs.BEGIN) + len(rs.BEGIN) : doc.index(rs.END)].strip()
    assert generated == rs.document().strip(), "run: python bench/repro_summary.py --write"
