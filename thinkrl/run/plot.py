"""`thinkrl plot RUN_DIR... --out fig.png`: the curves researchers compare methods by, one line per run."""

from __future__ import annotations

from pathlib import Path

from thinkrl.run.readers import Run, eval_keys

# (title, y label, metric keys tried in order; the first a run has is drawn)
PANELS = [
    ("Reward", "mean verifier reward", ["reward/mean"]),
    ("Entropy", "policy entropy (nats / token)", ["entropy"]),
    ("Completion length", "tokens", ["length/mean"]),
    ("Clipped / masked tokens", "fraction of tokens", ["clip/frac", "mask/frac"]),
]


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


def plot_runs(runs: list[Run], out: Path, window: int = 1, title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed (servers, CI)
    import matplotlib.pyplot as plt

    evals = list(dict.fromkeys(k for r in runs for k in eval_keys(r)))
    panels = PANELS + [("Held-out accuracy", "accuracy", evals)] if evals else PANELS
    cols = 3 if len(panels) > 4 else 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, ylabel, keys) in zip(axes.flat, panels):
        drawn = False
        for i, run in enumerate(runs):
            for j, key in enumerate(k for k in keys if run.series(k)[0]):
                steps, values = run.series(key)
                if name == "Held-out accuracy":  # few points: markers, no smoothing
                    ax.plot(
                        steps,
                        values,
                        marker="o",
                        color=colors[i % len(colors)],
                        linestyle=["-", "--", ":"][j % 3],
                        label=f"{run.label}: {key.removeprefix('eval/')}" if len(keys) > 1 else run.label,
                    )
                else:
                    ax.plot(steps, smooth(values, window), color=colors[i % len(colors)], linewidth=1.6, label=run.label)
                drawn = True
                if name != "Held-out accuracy":
                    break  # one line per run: the first key it has
        ax.set_title(name)
        if ylabel in ("fraction of tokens", "accuracy"):
            ax.set_ylim(bottom=0)  # fractions: keep 0 at the bottom, also when every value is 0
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    smoothing = f" (moving average over {window} steps)" if window > 1 else ""
    fig.suptitle((title or "thinkrl: " + ", ".join(r.label for r in runs)) + smoothing)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
