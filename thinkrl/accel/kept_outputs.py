"""What a checkpointed decoder layer keeps for its recompute, so the recompute skips its costliest parts.

Checkpointing (forward._checkpointed) drops a layer's activations after its forward and runs the forward
again in the backward. Some results are small next to the work that recomputes them: the long causal
attention's output and log-sum-exp (causal_attention.py), and a linear layer's output, 2 x in_features FLOPs
per value to recompute (fused_lora.py). `kept_in_recompute(shapes)` gives torch.utils.checkpoint a pair of
contexts: inside the layer's forward `result(tag, compute)` stores what compute returns; inside the recompute
it hands that value back. The same operation on the same inputs made it, so no value or gradient changes.
Which linear layers keep their outputs is the update phase's choice per pass: as many as the activation
budget holds, the most recompute FLOPs per byte first (`kept_linears`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

# ("store" | "reuse", that layer's stored (tag, value) pairs in call order, the kept linear shapes)
_mode: tuple[str, list, frozenset] | None = None


@contextlib.contextmanager
def _kept(how: str, results: list, shapes: frozenset) -> Iterator[None]:
    global _mode
    before, _mode = _mode, (how, results, shapes)
    try:
        yield
    finally:
        _mode = before


def kept_in_recompute(shapes: frozenset = frozenset()) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """`context_fn` for torch.utils.checkpoint: (forward context, replay context) of one checkpointed layer."""
    results: list[tuple[Any, Any]] = []
    return _kept("store", results, shapes), _kept("reuse", results, shapes)


def active() -> bool:
    """Inside a checkpointed layer's forward or replay."""
    return _mode is not None


def keeps(shape: tuple[int, int]) -> bool:
    """Whether a linear layer of this (in_features, out_features) keeps its output in this layer."""
    return _mode is not None and shape in _mode[2]


def result(tag: Any, compute: Callable[[], Any]) -> Any:
    """compute() (a tensor or a tuple of them), stored by a checkpointed layer's forward and handed back by its
    replay. `tag` names the call; the replay makes the same calls in the same order, which the tag checks."""
    if _mode is None:
        return compute()
    how, results, _ = _mode
    if how == "reuse" and results:
        stored, value = results.pop(0)
        if stored is not tag:
            raise RuntimeError(f"checkpoint replay out of step: expected the result of {stored!r}, asked for {tag!r}")
        return value
    value = compute()
    if how == "store":  # detached: a tensor of its own for the replay to return as a new output
        results.append((tag, tuple(v.detach() for v in value) if isinstance(value, tuple) else value.detach()))
    return value


def kept_linears(shapes: Counter, bytes_per_value: int, room: int) -> frozenset:
    """The (in_features, out_features) of the linear layers whose outputs checkpointed layers keep, given how
    many layers of each shape the model has, the bytes one output feature takes over the pass (tokens x element
    size) and the room left in the budget: most recompute FLOPs per byte kept first (in_features, largest
    first: the MLP's down projection in Llama-shaped models; smaller outputs first among equals), each that
    still fits."""
    kept = set()
    for shape in sorted(shapes, key=lambda s: (-s[0], s[1])):
        cost = shapes[shape] * shape[1] * bytes_per_value
        if cost <= room:
            kept.add(shape)
            room -= cost
    return frozenset(kept)
