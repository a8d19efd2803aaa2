"""The trainer's calls into a method, checked at the boundary: loss() and begin_step().

A method's loss must return (a scalar tensor that carries a gradient, a dict of scalar tensors). What a method
returns is checked for every method: a loss without grad, a vector loss or a metric that is not a one-element
tensor is a UserError naming the method and its file (it would fail later as a bare torch traceback, or skip
every update). An exception raised inside a plugin's loss() or begin_step() (--plugins DIR or an entry point)
becomes one line naming the plugin's file and line; a built-in method's keeps its traceback (a thinkrl bug).
A real out-of-memory error (torch.OutOfMemoryError) passes through unchanged, so train.py reports it as one.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from thinkrl.errors import UserError, short

_BUILT_IN = Path(__file__).resolve().parent.parent / "methods"  # thinkrl/methods/: the methods thinkrl ships


def loss(method, batch) -> tuple[Tensor, dict[str, Tensor]]:
    """method.loss(batch), checked: (scalar loss with grad, {name: one-element tensor})."""
    out = _call(method, "loss", batch)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise UserError(f"{_who(method)}: loss() returned {short(out)} ({type(out).__name__}), not a (loss, metrics) pair")
    value, metrics = out
    if not isinstance(value, Tensor):
        raise UserError(f"{_who(method)}: loss() returned the loss {short(value)} ({type(value).__name__}), not a torch tensor")
    if value.numel() != 1:
        raise UserError(
            f"{_who(method)}: loss() returned a loss of shape {tuple(value.shape)}, not a scalar; reduce it to one number "
            "(thinkrl.methods._common.reduce, or .mean())"
        )
    if not value.requires_grad:
        raise UserError(
            f"{_who(method)}: loss() returned a loss that does not require grad, so no update could follow it; compute it "
            "from batch.logp without .detach(), .item() or torch.no_grad()"
        )
    return value, _metrics(method, "loss()", metrics)


def begin_step(method, view) -> dict[str, Any]:
    """method.begin_step(view), checked: a dict of numbers or one-element tensors."""
    out = _call(method, "begin_step", view)
    if not isinstance(out, dict):
        raise UserError(f"{_who(method)}: begin_step() returned {short(out)} ({type(out).__name__}), not a dict of metrics")
    for k, v in out.items():
        if not (isinstance(v, numbers.Real) or (isinstance(v, Tensor) and v.numel() == 1)):
            raise UserError(f"{_who(method)}: begin_step() metric {k!r} is {short(v)} ({type(v).__name__}), not a number")
    return out


def _metrics(method, where: str, metrics: Any) -> dict[str, Tensor]:
    if not isinstance(metrics, dict):
        raise UserError(f"{_who(method)}: {where} returned the metrics {short(metrics)} ({type(metrics).__name__}), not a dict")
    for k, v in metrics.items():
        if not (isinstance(v, Tensor) and v.numel() == 1):
            what = f"shape {tuple(v.shape)}" if isinstance(v, Tensor) else f"{short(v)} ({type(v).__name__})"
            raise UserError(
                f"{_who(method)}: {where} metric {k!r} is {what}, not a one-element tensor; return e.g. "
                f"torch.tensor(value) or a masked mean (thinkrl.ops.masked_mean)"
            )
    return metrics


def _call(method, name: str, arg):
    try:
        return getattr(method, name)(arg)
    except torch.OutOfMemoryError:  # a real one: train.py names the settings that lower memory
        raise
    except UserError:
        raise
    except Exception as e:
        source = _source(method)
        if source is None or source.resolve().is_relative_to(_BUILT_IN):  # a thinkrl bug keeps its traceback
            raise
        from thinkrl.methods import _describe, _plugin_line

        line = _plugin_line(e, source)
        raise UserError(
            f"{_who(method)}: {name}() raised {_describe(e)}{f' (line {line})' if line else ''}; fix the plugin "
            "(`thinkrl --debug train ...` shows the traceback)"
        ) from e


def _source(method) -> Path | None:
    from thinkrl.methods import method_source

    try:
        return Path(method_source(method.name))
    except (UserError, TypeError, OSError):  # not registered (a test's own instance)
        return None


def _who(method) -> str:
    source = _source(method)
    return f"method {method.name}" + (f" ({source})" if source is not None else "")
