"""bench/repro_summary.py: each declared row's verdict from hand-made probe and study reports (supported, against
the claim, not detected with its MDE, secondary rows unadjusted), missing results, and the doc's generated part."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import repro_summary as rs  # noqa: E402


def comparison(arm, base, measure, diff, p_holm, p=None, kind="probe", mde=0.01):
    keys = {"method": arm, "measure": measure} if kind == "probe" else {"arm": arm, "metric": measure}
    paired = {"mean_diff": diff, "lower": diff - 0.01, "upper": diff + 0.01, "n": 200}
    return {**keys, "baseline": base, "paired": paired, "p_holm": p_holm, "p": p, "mde": mde}


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "RESULTS", tmp_path)

    def put(kind, name, comparisons, cpu=None):
        d = tmp_path / rs.FOLDER[kind] / name
        d.mkdir(parents=True)
        (d / ("probe.json" if kind == "probe" else "report.json")).write_text(json.dumps({"comparisons": comparisons}))
        if cpu:
            (d / "cpu.json").write_text(json.dumps(cpu))

    return put


def test_a_row_says_supported_contradicted_or_what_it_could_detect(results):
    results("probe", "stare", [comparison("stare", "dapo", "entropy_slope", 0.02, 0.001)], {"user_s": 600, "sys_s": 60})
    results(
        "probe", "drpo", [comparison("dppo", "drpo", "cos_ref", 0.03, 0.01), comparison("grpo", "drpo", "cos_ref", -0.01, 0.4, mde=0.02)]
    )
    results(
        "probe", "ict", [comparison("ict", "grpo", "entropy_slope_unit", -0.05, 0.02)], {"user_s": 1700, "sys_s": 100, "estimate": "how"}
    )
    results("probe", "sis-stale2", [comparison("sis", "grpo", "cos_ref", 0.04, None, p=0.01)])
    results("study", "thinking_seeds", [comparison("thinking_seeds", "grpo", "eval/arith/avg@1", -0.04, 0.3, kind="study", mde=0.1)])
    text = rs.table()
    stare = next(line for line in text.splitlines() if line.startswith("| stare"))
    assert "supported in miniature" in stare and "| 11 min |" in stare  # user + system
    drpo = [line for line in text.splitlines() if line.startswith("| drpo")]
    assert "contradicted in miniature" in drpo[0]  # the claim predicts dppo - drpo < 0
    assert "no difference detected (could detect 0.02)" in drpo[1]
    ict = next(line for line in text.splitlines() if line.startswith("| ict"))
    assert "contradicted in miniature" in ict and "| about 30 min (estimated) |" in ict  # a cpu.json that says it estimates
    sis = [line for line in text.splitlines() if line.startswith("| sis")]
    assert "pending: no results yet" in sis[0]  # the primary file has no results here: said first, not hidden
    assert "| secondary |" in sis[1] and "(unadjusted)" in sis[1] and "supported in miniature" in sis[1]
    seeds = next(line for line in text.splitlines() if line.startswith("| thinking_seeds"))
    assert "`thinkrl study bench/repro/studies/thinking_seeds.yaml`" in seeds
    assert "| thinking_seeds - grpo |" in seeds and "no difference detected (could detect 0.1)" in seeds  # a study's report
    assert "| ctpo | primary | cos_ref | - |" in text
    assert "Total CPU (user + system) of the results above: 0.7 h, of which 0.2 h measured and 0.5 h estimated" in text  # 660 s; 1800 s


def test_write_replaces_only_the_generated_part(results, tmp_path, monkeypatch):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{rs.BEGIN}\nold table\n{rs.END}\nafter\n")
    monkeypatch.setattr(rs, "DOC", doc)
    monkeypatch.setattr(sys, "argv", ["repro_summary.py", "--write"])
    monkeypatch.setattr(rs, "ROOT", tmp_path)
    rs.main()
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{rs.END}\nafter\n") and "old table" not in text and "| paper |" in text


def test_every_declared_row_names_a_file_in_the_repo_that_loads_with_its_arms_and_measure():
    """A reader reruns a row from its file: each declared file loads, its methods build and can be probed, and the
    row's comparisons and measure are the ones the file declares (the first probe arm is the baseline)."""
    from thinkrl.probe.measure import check_method
    from thinkrl.probe.spec import load_probe_file
    from thinkrl.study.spec import load_study

    for row in rs.ROWS:
        for name in (row.file, *row.secondary_files):
            path = BENCH / "repro" / rs.FOLDER[row.kind] / f"{name}.yaml"
            if row.kind == "probe":
                pf = load_probe_file(path)
                for arm in pf.arms:
                    check_method(arm.build())
                labels, declared = [a.label for a in pf.arms], pf.primary
                pairs = {(a, labels[0]) for a in labels[1:]}
            else:
                study = load_study(path)
                pairs, declared = set(study.comparisons), tuple(m.name for m in study.metrics)
            assert set(row.comparisons) <= pairs, (name, row.comparisons, pairs)
            assert row.measure in declared, (name, row.measure, declared)


def test_the_committed_summary_is_the_one_the_committed_results_give():
    doc = rs.DOC.read_text()
    generated = doc[doc.index(rs.BEGIN) + len(rs.BEGIN) : doc.index(rs.END)].strip()
    assert generated == rs.table().strip(), "run: python bench/repro_summary.py --write"
