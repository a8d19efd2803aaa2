"""The built-in task: seeded arithmetic problems ("What is 27 + 82?") whose answers math-verify can check.
Train and test splits are disjoint, so `thinkrl train` with no arguments runs and evaluates offline."""

from __future__ import annotations

import random

from thinkrl.config import ArithConfig
from thinkrl.data.problems import Problem
from thinkrl.errors import UserError


def _arith_value(nums: list[int], ops: list[str]) -> int:
    """Evaluate with the usual precedence (* before + and -), without eval()."""
    terms, signs = [nums[0]], []
    for op, n in zip(ops, nums[1:]):
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(op)
    total = terms[0]
    for op, t in zip(signs, terms[1:]):
        total = total + t if op == "+" else total - t
    return total


def arith_problems(cfg: ArithConfig, split: str) -> list[Problem]:
    """Seeded unique problems; the first test_size go to 'test', the next train_size to 'train'."""
    if split not in ("train", "test"):
        raise UserError(f"the arith task has splits train and test, not {split!r}")
    needed = cfg.train_size + cfg.test_size  # ArithConfig checked that the range holds this many
    rng = random.Random(cfg.seed)
    seen, out = set(), []
    while len(out) < needed:
        nums = [rng.randint(cfg.min_value, cfg.max_value) for _ in range(cfg.terms)]
        ops = [rng.choice(cfg.ops) for _ in range(cfg.terms - 1)]
        expr = " ".join(f"{n} {o}" for n, o in zip(nums, ops)) + f" {nums[-1]}"
        if expr in seen:
            continue
        seen.add(expr)
        out.append(Problem(id=f"arith-{len(out)}", problem=f"What is {expr}?", answer=str(_arith_value(nums, ops))))
    return out[: cfg.test_size] if split == "test" else out[cfg.test_size :]
