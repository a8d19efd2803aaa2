"""`thinkrl plot RUN_DIR... --out fig.png`: the curves researchers compare methods by, against step.

Panels: by default reward, entropy, completion length, clipped/masked tokens and (when logged) held-out
accuracy; with `--metrics KEY|GLOB ...` one panel per metrics.jsonl key that a key or shell-style pattern
names (`ratio/*`, `mismatch/*`, `prefix/*`), in the order of the patterns, then of the keys in the files.
Lines: one per run, except that runs whose config.yaml differ only in train.seed are drawn as their mean
(over the steps every seed has logged) with a band from the lowest to the highest seed (min-max), labelled
with the method and the number of seeds (thinkrl/run/readers.py `seed_groups`). With --smooth N > 1 the
raw trace is drawn faint under the moving average. Held-out accuracy (eval/ keys) is drawn with markers
and never smoothed. The step axis has integer ticks.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.run.readers import Run, eval_keys, seed_groups

# (title, y label, metric keys tried in order; the first a run has is drawn)
PANELS = [
    ("Reward", "mean verifier reward", ["reward/mean"]),
    ("Entropy", "policy entropy (nats / token)", ["entropy"]),
    ("Completion length", "tokens", ["length/mean"]),
    ("Clipped / masked tokens", "fraction of tokens", ["clip/frac", "mask/frac"]),
]
HELD_OUT = "Held-out accuracy"
DASHES = ["-", "--", "-.", ":"]


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (1 = raw); the first points average what exists."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def panels_for(runs: list[Run], metrics: list[str] | None) -> list[tuple[str, str, list[str]]]:
    """(title, y label, keys) per panel: the default panels, or one per key that --metrics names."""
    if not metrics:
        evals = list(dict.fromkeys(k for r in runs for k in eval_keys(r)))
        return PANELS + [(HELD_OUT, "accuracy", evals)] if evals else list(PANELS)
    logged = [k for k in dict.fromkeys(k for r in runs for k in r.keys()) if k != "step"]
    keys: list[str] = []
    for pattern in metrics:
        found = [k for k in logged if fnmatchcase(k, pattern)]
        if not found:
            raise UserError(f"--metrics {pattern}: no metrics.jsonl key matches; logged keys: {', '.join(logged)}")
        keys += [k for k in found if k not in keys]
    return [(k, k, [k]) for k in keys]


def _series(run: Run, key: str, window: int) -> dict[int, tuple[float, float]]:
    """step -> (raw value, smoothed value)."""
    steps, values = run.series(key)
    return dict(zip(steps, zip(values, smooth(values, window))))


def _draw_line(ax, members: list[Run], key: str, window: int, markers: bool, style: dict) -> bool:
    """One run's line, or a seed group's mean with its min-max band; False when nothing was logged."""
    per_run = [_series(r, key, window if not markers else 1) for r in members]
    steps = sorted(set.intersection(*(set(s) for s in per_run)))
    if not steps:
        return False
    raw = [sum(s[t][0] for s in per_run) / len(per_run) for t in steps]
    smoothed = [[s[t][1] for s in per_run] for t in steps]
    mean = [sum(v) / len(v) for v in smoothed]
    if markers:
        ax.plot(steps, mean, marker="o", **style)
    else:
        if window > 1:  # the raw trace, faint, under the moving average
            ax.plot(steps, raw, color=style["color"], linestyle=style["linestyle"], linewidth=0.8, alpha=0.3)
        ax.plot(steps, mean, linewidth=1.6, **style)
    if len(members) > 1:
        ax.fill_between(steps, [min(v) for v in smoothed], [max(v) for v in smoothed], color=style["color"], alpha=0.2, linewidth=0)
    return True


def draw(runs: list[Run], window: int = 1, title: str | None = None, metrics: list[str] | None = None):
    """The figure (matplotlib, Agg backend): one axes per panel, titled by the panel (see the module doc)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed (servers, CI)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = panels_for(runs, metrics)
    groups = seed_groups(runs)
    cols = 1 if len(panels) == 1 else 3 if len(panels) > 4 else 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    repeat: dict[str, int] = {}  # the n-th line of one method is dashed differently: equal curves stay visible
    dashes = []
    for _, members in groups:
        dashes.append(DASHES[repeat.get(members[0].method, 0) % len(DASHES)])
        repeat[members[0].method] = repeat.get(members[0].method, 0) + 1
    for ax, (name, ylabel, keys) in zip(axes.flat, panels):
        held_out = name == HELD_OUT or (metrics is not None and keys[0].startswith("eval/"))
        drawn = False
        for i, (label, members) in enumerate(groups):
            have = [k for k in keys if all(r.series(k)[0] for r in members)]
            for j, key in enumerate(have if name == HELD_OUT else have[:1]):  # held-out: every dataset
                several = name == HELD_OUT and len(keys) > 1
                style = {
                    "color": colors[i % len(colors)],
                    "linestyle": DASHES[j % len(DASHES)] if several else dashes[i],
                    "label": f"{label}: {key.removeprefix('eval/')}" if several else label,
                }
                drawn = _draw_line(ax, members, key, window, held_out, style) or drawn
        ax.set_title(name)
        if ylabel in ("fraction of tokens", "accuracy"):
            ax.set_ylim(bottom=0)  # fractions: keep 0 at the bottom, also when every value is 0
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers, also on a 3-step run
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    smoothing = f" (moving average over {window} steps)" if window > 1 else ""
    fig.suptitle((title or "thinkrl: " + ", ".join(label for label, _ in groups)) + smoothing)
    fig.tight_layout()
    return fig


def plot_runs(runs: list[Run], out: Path, window: int = 1, title: str | None = None, metrics: list[str] | None = None) -> Path:
    """Draw (see `draw`) and write the figure to `out`; the format follows its suffix."""
    fig = draw(runs, window, title, metrics)
    import matplotlib.pyplot as plt  # after draw() chose the Agg backend

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
