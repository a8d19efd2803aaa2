"""Experiment trackers (TensorBoard, Weights & Biases, MLflow, ...) through Accelerate's tracking API.

    log.trackers: [tensorboard]        # or wandb, mlflow, comet_ml, aim, clearml, dvclive, swanlab, trackio
    log.project: thinkrl               # W&B/MLflow project; TensorBoard writes RUN_DIR/trackers/<project>/

metrics.jsonl stays the source of truth: trackers get the same numbers, one point per step, from rank 0.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from thinkrl.errors import UserError

# tracker name -> the package it needs (what `pip install` takes)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
    "comet_ml": ("comet_ml",),
    "aim": ("aim",),
    "clearml": ("clearml",),
    "dvclive": ("dvclive",),
    "swanlab": ("swanlab",),
    "trackio": ("trackio",),
}


def check(trackers: list[str]) -> None:
    """A clear error for an unknown tracker or one whose package is missing (before any work is done)."""
    for name in trackers:
        if name not in PACKAGES:
            raise UserError(f"log.trackers: unknown tracker {name!r}; choose from {', '.join(PACKAGES)}")
        if not any(importlib.util.find_spec(pkg) for pkg in PACKAGES[name]):
            raise UserError(
                f"log.trackers: {name} needs the {PACKAGES[name][0]} package: pip install {PACKAGES[name][0]}"
                + (" (or pip install 'thinkrl[trackers]')" if name == "tensorboard" else "")
            )


def accelerator_kwargs(log_cfg, run_dir: Path) -> dict:
    if not log_cfg.trackers:
        return {}
    check(log_cfg.trackers)
    return {"log_with": list(log_cfg.trackers), "project_dir": str(run_dir / "trackers")}


def start(accelerator, cfg) -> None:
    """Open the trackers with the run's config as hyperparameters (flattened to dotted keys)."""
    if cfg.log.trackers:
        from thinkrl.config.load import flatten, to_dict

        # hyperparameters as dotted keys; TensorBoard's hparams take scalars only, so the rest becomes text
        params = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in flatten(to_dict(cfg))}
        accelerator.init_trackers(cfg.log.project, config=params)


def loggable(record: dict) -> dict:
    """The numeric metrics of a metrics.jsonl line (trackers take numbers; the step is passed apart)."""
    return {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
