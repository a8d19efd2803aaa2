"""How many ordinary completions per second the verifier pool grades, by number of workers.

    python bench/verifier_throughput.py                      # workers 1 and 2, 2000 completions each
    python bench/verifier_throughput.py --workers 1,2,4 --n 5000 --batch 16

Completions are generated from the built-in arithmetic task and look like a small model's: a line of
working and a boxed answer that is right about half the time, with a few unboxed or wrong-format ones.
Each setting starts a fresh pool (start-up is reported apart, not counted), grades a warm-up batch, then
grades --n completions in batches of --batch (a training step hands the pool prompts_per_step x
group_size completions at once). Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import random
import time

from thinkrl.config import ArithConfig
from thinkrl.data.arith import arith_problems
from thinkrl.verifier import VerifierPool


def completions(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    problems = arith_problems(ArithConfig(train_size=max(n, 100), test_size=10), "train")
    texts, answers = [], []
    for i in range(n):
        p = problems[i % len(problems)]
        expr = p.problem.removeprefix("What is ").removesuffix("?")
        value = int(p.answer) + (0 if rng.random() < 0.5 else rng.choice([-10, -1, 1, 2, 10]))
        style = rng.random()
        if style < 0.8:
            text = f"We add the numbers: {expr} = {value}.\nThe answer is \\boxed{{{value}}}."
        elif style < 0.9:
            text = f"{expr} = {value}, so the answer is {value}"  # unboxed: math-verify's own extraction
        else:
            text = f"First {expr}. Then \\boxed{{{expr}}}"  # restates the question: scores 0
        texts.append(text)
        answers.append(p.answer)
    return texts, answers


def measure(workers: int, texts: list[str], answers: list[str], batch: int, timeout: float) -> dict:
    t0 = time.perf_counter()
    with VerifierPool(workers=workers, timeout=timeout) as pool:
        startup = time.perf_counter() - t0
        pool.grade(texts[:batch], answers[:batch])  # warm-up
        t1 = time.perf_counter()
        right, stats = 0.0, {"timeouts": 0, "crashes": 0}
        for i in range(0, len(texts), batch):
            scores, s = pool.score(texts[i : i + batch], answers[i : i + batch])
            right += sum(scores)
            stats = {k: stats[k] + s[k] for k in stats}
        elapsed = time.perf_counter() - t1
    return {
        "workers": workers,
        "startup_s": startup,
        "per_s": len(texts) / elapsed,
        "ms_each": 1000 * elapsed / len(texts),
        "correct": right / len(texts),
        **stats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--n", type=int, default=2000, help="completions graded per setting")
    ap.add_argument("--batch", type=int, default=64, help="completions per pool.grade call")
    ap.add_argument("--timeout", type=float, default=5.0, help="per-sample time limit (verifier.timeout)")
    args = ap.parse_args()
    texts, answers = completions(args.n)
    print(f"{'workers':>7}  {'start-up s':>10}  {'completions/s':>13}  {'ms each':>8}  {'correct':>7}  {'timeouts':>8}  {'crashes':>7}")
    for w in (int(x) for x in args.workers.split(",")):
        r = measure(w, texts, answers, args.batch, args.timeout)
        print(
            f"{r['workers']:>7}  {r['startup_s']:>10.2f}  {r['per_s']:>13.0f}  {r['ms_each']:>8.2f}  {r['correct']:>7.3f}  "
            f"{r['timeouts']:>8}  {r['crashes']:>7}"
        )


if __name__ == "__main__":
    main()
