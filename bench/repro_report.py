"""docs/reproductions-3seed.md and docs/reproductions/<claim>.png from bench/repro/results/ alone (bench/reproduce.py
writes those JSONs), so a table can be regenerated and committed while the grid is still filling.

Statistics: per arm the mean over seeds with a 95% t-interval (n - 1 df); per comparison the difference
method - baseline with a 95% Welch interval. Verdict: "reproduced" when that interval excludes 0 in the
claimed direction, "not reproduced" when it excludes 0 in the other, "inconclusive" otherwise, and
"pending, k of 3 seeds" until both arms have 3 seeds. scipy is not a dependency, so the t quantile is
computed in repro_stats.py (regularised incomplete beta, bisection).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro_stats import mean_ci, welch

SEEDS_NEEDED = 3
SPIKE = 5.0  # a step's grad_norm above SPIKE x its run's median grad_norm counts as exploding
RATIO_GT2 = 0.05  # ... and so does a step where more than 5% of tokens have pi_old / mu > 2


HEADER = """# Reproductions in miniature: the 3-seed, 40-step runs (superseded)

Superseded by [reproductions.md](reproductions.md), where each paper has one primary measure declared before
its runs and enough paired replicates or seeds to say how large a difference it could have seen. Kept for the
record, with two corrections: three seeds of a 40-step miniature detect a one-standard-deviation effect about
11% of the time, so an "inconclusive" below says nothing either way; ict's "reproduced" entropy and diversity
rows compare grpo with a policy that barely trained (ict's gradient was about 20 times smaller than grpo's), so
they show that, not the paper's claim; and the correlation of sis's acceptance with the sampler's mismatch is
not the paper's claim (its test compares the current policy with the proposal, not the sampler with the
trainer), so that row is now descriptive. Also: sis's arm recomputed pi_old, so its proposal was not the stale
sampler the paper is about (sis's recipe now takes pi_old from the sampler); ais had no full-precision arm, so
"recovers what fp8 loses" was not tested; ctpo at 48 tokens is far from the long sequences its sqrt(t) bounds
are for.

Each seed paper's claim, tested at the scale of the demo: the bundled SmolLM2-135M-Instruct with LoRA r=16, the
built-in arithmetic task, 2 prompts per step, 48 new tokens, 40 steps unless a row says otherwise, 3 seeds
(`train.seed` 0, 1, 2: the same prompts for every arm of a row), held-out accuracy greedy on the same 200 test
problems (`thinkrl eval --limit 200`, the run's own template and budget). Written by `python bench/reproduce.py
--report` from `bench/repro/results/` alone; the run directories are not kept in git.

Per metric: each arm's mean over seeds with its 95% t-interval (n - 1 df), the difference method - baseline with
its 95% Welch interval, and a verdict: **reproduced** (the interval excludes 0 in the claimed direction), **not
reproduced** (it excludes 0 the other way), **inconclusive** (it contains 0), *pending* (fewer than 3 seeds).
Stability measures skip steps without a gradient (every group's rewards equal): an *exploding step* has grad_norm
(before the clip at 1) above 5x its run's median (per run, because the methods aggregate their losses differently
and raw norms are not comparable across arms), or more than 5% of its tokens with pi_old / mu > 2
(`mismatch/ratio_gt2_frac`); *variability* is std / mean of grad_norm over steps, for the same reason. Three seeds
of a 40-step miniature detect only large effects: "inconclusive" is the expected reading of a small one, and a
verdict here is about thinkrl's implementation at this scale, not about the paper.

Run: `python bench/reproduce.py` (every row; `--claims ctpo,ais` for some), resumable and interruptible with Ctrl-C;
the tables fill as result JSONs appear. Measured on an idle 2-core machine: an off-policy run (32 completions and
4 updates per step; the ctpo row) 9-14 min of training and ~45 s of evaluation; a default-size run with an fp8
sampler (the ais row) 5-8.5 min and ~40 s; ict's steps take ~15 s (about 10 min a run) and thinking_seeds' ~15 s.
The 51 runs took several sessions. sis's and drpo's grpo arm share one command and run directory per seed;
seeds 0 and 1 were trained a second time for drpo (their directories had been removed), with 1 thread instead of
2, and their traces and accuracies came out the same to the 6 digits the JSONs keep. Runs whose JSON says
`"threads": 1` ran two at a time, each with `OMP_NUM_THREADS=1`, to keep both cores busy: the same command, not the
same bits as a 2-thread run (summation order), and wall times that are not comparable with the others' (up to 26
min of training a run; a run resumed after an interruption records only its last part)."""


@dataclass
class Claim:
    method: str
    claim: str
    regime: tuple[str, ...]  # -o overrides every arm gets
    why: str
    arms: dict[str, tuple[str, tuple[str, ...]]]  # arm -> (method, -o overrides of that arm only); first = the method
    metrics: tuple[str, ...]
    plot: tuple[str, ...]
    reading: str  # what the miniature can and cannot show, printed under the table
    steps: int = 40


# ---------------------------------------------------------------- per-run measures (one number per seed)


def _rows(r: dict, need: str = "") -> list[dict]:
    """The run's per-step trace as one dict per step. need="update": only steps whose update ran (a step where
    dynamic sampling kept no group logs entropy 0); "signal": also some reward signal (when every group's
    rewards are equal the gradient is exactly zero and says nothing about stability)."""
    t = r["trace"]
    rows = [{k: v[i] for k, v in t.items()} for i in range(len(t.get("step", [])))]
    if need:
        rows = [x for x in rows if (x.get("update/optimizer_steps") or 0) > 0]
    if need == "signal":
        rows = [x for x in rows if (x.get("frac_reward_zero_std") or 0) < 1]
    return rows


def _series(r: dict, key: str, need: str = "") -> list[float]:
    return [x[key] for x in _rows(r, need) if isinstance(x.get(key), (int, float))]


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def unstable_frac(r: dict) -> float | None:
    """Share of trained steps with an exploding gradient (grad_norm above SPIKE x the run's own median: the
    methods aggregate their losses differently, so raw norms are not comparable across arms) or ratio
    (mismatch/ratio_gt2_frac above RATIO_GT2)."""
    rows = [x for x in _rows(r, "signal") if isinstance(x.get("grad_norm"), (int, float))]
    if not rows:
        return None
    med = statistics.median(x["grad_norm"] for x in rows)
    return statistics.fmean(x["grad_norm"] > SPIKE * med or (x.get("mismatch/ratio_gt2_frac") or 0) > RATIO_GT2 for x in rows)


def grad_cv(r: dict) -> float | None:
    """std / mean of grad_norm over trained steps: the gradient's variance without the scale of the loss."""
    g = _series(r, "grad_norm", "signal")
    return statistics.stdev(g) / statistics.fmean(g) if len(g) > 1 and statistics.fmean(g) > 0 else None


def entropy_min(r: dict) -> float | None:
    e = _series(r, "entropy", "update")
    smooth = [statistics.fmean(e[max(0, i - 4) : i + 1]) for i in range(len(e))]  # 5-step moving average: one noisy step is no collapse
    return min(smooth) if smooth else None


def accept_corr(r: dict) -> float | None:
    """Pearson correlation over steps of SIS's acceptance with the sampler/trainer mismatch (the claim: the
    rejection test rejects more where the data is more off-policy, so it is negative)."""
    pairs = [
        (x["sis/accept_frac"], x["mismatch/abs_log_ratio"])
        for x in _rows(r)
        if x.get("sis/accept_frac") is not None and x.get("mismatch/abs_log_ratio") is not None
    ]
    a, m = [p[0] for p in pairs], [p[1] for p in pairs]
    return statistics.correlation(a, m) if len(pairs) > 2 and len(set(a)) > 1 and len(set(m)) > 1 else None


# name -> (label, claimed direction: +1 higher is the claim, -1 lower, 0 descriptive; method arm only?, measure)
METRICS: dict[str, tuple[str, int, bool, Callable[[dict], float | None]]] = {
    "accuracy": ("held-out accuracy (greedy, avg@1)", +1, False, lambda r: r["accuracy"]["avg@1"]),
    "unstable_frac": (f"exploding steps (grad_norm > {SPIKE:g}x run median or ratio_gt2_frac > {RATIO_GT2:g})", -1, False, unstable_frac),
    "grad_cv": ("grad_norm variability (std / mean over steps)", -1, False, grad_cv),
    "entropy_final": ("final entropy (mean of last 5 steps)", +1, False, lambda r: _mean(_series(r, "entropy", "update")[-5:])),
    "entropy_min": ("lowest entropy (5-step moving average)", +1, False, entropy_min),
    "entropy_mean": ("entropy, mean over steps", +1, False, lambda r: _mean(_series(r, "entropy", "update"))),
    "distinct": ("distinct answers per group, mean over steps", +1, False, lambda r: _mean(_series(r, "answers/distinct_per_group"))),
    "mismatch_abs": ("mismatch/abs_log_ratio, mean over steps", 0, False, lambda r: _mean(_series(r, "mismatch/abs_log_ratio"))),
    "mismatch_k3": ("mismatch/k3, mean over steps", 0, False, lambda r: _mean(_series(r, "mismatch/k3"))),
    "accept_frac": ("sis/accept_frac, mean over steps", 0, True, lambda r: _mean(_series(r, "sis/accept_frac"))),
    "accept_corr": ("corr(sis/accept_frac, mismatch/abs_log_ratio) over steps", 0, True, accept_corr),
}


# ---------------------------------------------------------------- verdicts (the intervals: repro_stats.py)


def verdict(diff: float, half: float | None, direction: int, n: int) -> str:
    """n: seeds of the arm with fewer. A difference whose interval excludes 0 the claimed way is reproduced."""
    if n < SEEDS_NEEDED or half is None:
        return f"pending, {min(n, SEEDS_NEEDED)} of {SEEDS_NEEDED} seeds"
    if direction == 0:
        return "descriptive"
    if diff - half > 0 or diff + half < 0:
        return "reproduced" if (diff > 0) == (direction > 0) else "not reproduced"
    return "inconclusive"


# ---------------------------------------------------------------- the document


def load_results(results: Path, name: str, claim: Claim) -> dict[str, list[dict]]:
    """arm -> its finished seeds' results, by seed."""
    out = {}
    for arm in claim.arms:
        files = sorted((results / name / arm).glob("seed-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        out[arm] = [json.loads(p.read_text()) for p in files]
    return out


def _fmt(m: float | None, half: float | None = None) -> str:
    if m is None:
        return "-"
    return f"{m:.3g}" if half is None else f"{m:.3g} ± {half:.2g}"


def claim_section(
    name: str, claim: Claim, runs: dict[str, list[dict]], command: Callable[[str, str], str], plots: Path, doc: Path
) -> tuple[list[str], str]:
    """The markdown of one claim, and its one-line status for the summary table."""
    method_arm, baselines = next(iter(claim.arms)), list(claim.arms)[1:]
    regime = f"`{' '.join(f'-o {o}' for o in claim.regime)}`" if claim.regime else "none (the defaults)"
    arrow = {1: "higher", -1: "lower", 0: "descriptive"}
    measures = "; ".join(f"{METRICS[k][0]} ({arrow[METRICS[k][1]]}{', method only' if METRICS[k][2] else ''})" for k in claim.metrics)
    lines = [f"## {name}: {claim.claim}", "", f"Setting: {claim.why}", "", f"Regime of every arm: {regime}; {claim.steps} steps.", ""]
    lines += [f"Measures (the claim's direction): {measures}.", "", "| arm | command (seed K = 0, 1, 2) | seeds done |", "|---|---|---|"]
    for arm in claim.arms:
        done = runs[arm]
        cmd = re.sub(r"seed-\d+", "seed-K", re.sub(r"train\.seed=\d+", "train.seed=K", done[0]["command"])) if done else command(name, arm)
        lines.append(f"| {arm} | `{cmd}` | {len(done)} |")
    if not any(runs.values()):
        return [*lines, "", f"Not run yet: `python bench/reproduce.py --claims {name}`.", ""], "not run yet"
    lines += [
        "",
        "| metric | baseline | baseline mean ± 95% | method mean ± 95% | difference [95% Welch] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    tally: dict[str, int] = {}
    for key in claim.metrics:
        label, direction, method_only, measure = METRICS[key]
        vals = {arm: [v for v in map(measure, runs[arm]) if v is not None] for arm in claim.arms}
        mine = vals[method_arm]
        if method_only:  # one-sample: does the method's own quantity have the claimed sign?
            m, half = mean_ci(mine) if mine else (None, None)
            v = verdict(m or 0.0, half, direction, len(mine))
            lines.append(f"| {label} | (method only) | - | {_fmt(m, half)} | {_fmt(m, half)} vs 0 | {v} |")
            tally[v.split(",")[0]] = tally.get(v.split(",")[0], 0) + 1
            continue
        for base in baselines:
            theirs = vals[base]
            if not mine or not theirs:
                v, diff = f"pending, 0 of {SEEDS_NEEDED} seeds", "-"
            else:
                d, dh = welch(mine, theirs)
                v = verdict(d, dh, direction, min(len(mine), len(theirs)))
                diff = f"{d:+.3g}" + (f" [{d - dh:+.3g}, {d + dh:+.3g}]" if dh is not None else "")
            cells = [_fmt(*mean_ci(x)) if x else "-" for x in (theirs, mine)]
            lines.append(f"| {label} | {base} | {cells[0]} | {cells[1]} | {diff} | {v} |")
            tally[v.split(",")[0]] = tally.get(v.split(",")[0], 0) + 1
    status = ", ".join(f"{n} {v}" for v, n in sorted(tally.items()))
    lines += ["", f"Reading: of {sum(tally.values())} comparisons, {status}. {claim.reading}", ""]
    png = plots / f"{name}.png"
    if draw_plot(name, claim, runs, png):
        lines += [f"![{name}: traces, mean of seeds with min-max band]({png.relative_to(doc.parent).as_posix()})", ""]
    return lines, status


ROLLOUT_KEYS = (
    "step",
    "reward/mean",
    "length/mean",
    "answers/distinct_per_group",
    "seeds/seeded_frac",
    "frac_reward_zero_std",
    "time/step",
)


def _plotted(x: dict) -> dict:
    """A step as drawn: without the update's metrics when no update ran (they are logged as 0 then), and without
    grad_norm when no group had a reward signal (exactly 0), so neither draws a false dip."""
    if not (x.get("update/optimizer_steps") or 0):
        return {k: v for k, v in x.items() if k in ROLLOUT_KEYS}
    return {k: v for k, v in x.items() if k != "grad_norm" or (x.get("frac_reward_zero_std") or 0) < 1}


def draw_plot(name: str, claim: Claim, runs: dict[str, list[dict]], png: Path) -> bool:
    """thinkrl plot's figure, fed from the results' traces (no run directory needed): arms whose seeds differ
    only in train.seed are drawn as their mean with a min-max band."""
    from thinkrl.run.plot import plot_runs
    from thinkrl.run.readers import Run

    fake = [
        Run(Path(arm, str(r["seed"])), arm, arm, list(map(_plotted, _rows(r))), {"method": {"name": arm}, "train": {"seed": r["seed"]}})
        for arm in claim.arms
        for r in runs[arm]
        if r["trace"].get("step")
    ]
    keys = [k for k in claim.plot if any(isinstance(m.get(k), (int, float)) for run in fake for m in run.metrics)]
    if not keys:
        return False
    plot_runs(fake, png, window=5 if claim.steps >= 20 else 1, title=f"{name}: {claim.claim}", metrics=keys)
    return True


def write_report(claims: dict[str, Claim], results: Path, doc: Path, plots: Path, command: Callable[[str, str], str], header: str) -> Path:
    body, summary = [], ["| claim | method | status |", "|---|---|---|"]
    for name, claim in claims.items():
        lines, status = claim_section(name, claim, load_results(results, name, claim), command, plots, doc)
        body += lines
        anchor = "".join(ch for ch in f"{name}: {claim.claim}".lower() if ch.isalnum() or ch in " -_").replace(" ", "-")  # GitHub's
        summary.append(f"| [{name}](#{anchor}) | {claim.method} | {status} |")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join([header, "", *summary, "", *body]).rstrip() + "\n")
    return doc
