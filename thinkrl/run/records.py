"""What one step writes: its metrics.jsonl line and its rollouts.jsonl lines, for the global batch.

With several processes each rank holds its own groups. Row-level statistics (rewards, lengths) are
recomputed from every rank's rows, counts are summed, wall times are the slowest rank's, and other
per-group statistics are averaged weighted by each rank's number of groups; the update's metrics are
already global (thinkrl/learner/update.py reduces them). Only rank 0 writes.

A step that trained on nothing (dynamic sampling kept no group with a reward spread) logs what it did not
measure as NaN ("nan" in metrics.jsonl, which readers skip): loss, entropy, grad_norm (no update ran), and, with
no completion kept, the reward, length and zero-std statistics. A 0 there would read as a measurement. So does a
step whose every update was skipped as NaN/inf: its loss and grad_norm are nan, and its entropy too (no token of an
applied update was measured; thinkrl/learner/update.py). Every line also records torch/threads, the process's
torch.get_num_threads() (CPU arithmetic, and so a seed's numbers, can depend on it).
"""

from __future__ import annotations

import torch

from thinkrl import distributed

NAN = float("nan")
_SUMMED = ("verifier/timeouts", "verifier/crashes", "verifier/errors", "sampling/dropped_groups", "sampling/kept_groups")


def step_record(step: int, samples, upd: dict, astats: dict, times: dict) -> dict:
    """The metrics.jsonl line of one step (the same on every rank)."""
    comp = samples.comp
    rows = {
        "scores": samples.scores.tolist(),
        "rewards": samples.rewards.tolist(),
        "lengths": comp.lengths.tolist() if comp is not None else [],
        "truncated": comp.truncated.tolist() if comp is not None else [],
    }
    local = {**astats, **samples.stats, **times}
    parts = distributed.all_gather((rows, local, len(samples.prompts)))
    rows = {k: [v for p in parts for v in p[0][k]] for k in rows}
    unset = 0.0 if upd else NAN  # an update with every token masked measured 0; no update at all measured nothing
    record = {"step": step, **_row_stats(rows), **dict.fromkeys(("loss", "entropy", "grad_norm"), unset), **upd}
    record.update(_merge([(p[1], p[2]) for p in parts]))
    n_tok = sum(rows["lengths"])
    record["tokens/s"] = n_tok / max(record["time/step"], 1e-9)
    record["generate/tokens_per_s"] = n_tok / max(record["time/generate"], 1e-9)
    record["torch/threads"] = torch.get_num_threads()  # CPU results depend on it (a study notes seeds that differ)
    return record


def _row_stats(rows: dict[str, list]) -> dict[str, float]:
    if not rows["scores"]:  # no completion kept: no statistic of them (the sampled ones are in sampling/*)
        keys = ("reward/mean", "reward/std", "reward/shaped_mean", "length/mean", "length/max", "length/min", "length/truncated_frac")
        return {**dict.fromkeys(keys, NAN), "frac_reward_zero_std": NAN}
    scores = torch.tensor(rows["scores"] or [0.0])
    lengths = torch.tensor(rows["lengths"] or [0], dtype=torch.float32)
    return {
        "reward/mean": scores.mean().item(),
        "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
        "reward/shaped_mean": sum(rows["rewards"]) / len(rows["rewards"]) if rows["rewards"] else 0.0,
        "length/mean": lengths.mean().item(),
        "length/max": int(lengths.max()),
        "length/min": int(lengths.min()),
        "length/truncated_frac": sum(rows["truncated"]) / len(rows["truncated"]) if rows["truncated"] else 0.0,
        "frac_reward_zero_std": 0.0,
    }


def _merge(parts: list[tuple[dict, int]]) -> dict[str, float]:
    """Per-rank statistics -> one value each: sums, slowest wall time, or a mean weighted by groups."""
    if len(parts) == 1:
        return dict(parts[0][0])
    out = {}
    for key in dict.fromkeys(k for stats, _ in parts for k in stats):
        have = [(stats[key], groups) for stats, groups in parts if key in stats]
        if key in _SUMMED:
            out[key] = sum(v for v, _ in have)
        elif key.startswith("time/") or key == "sampling/rounds":
            out[key] = max(v for v, _ in have)
        else:
            total = sum(g for _, g in have)
            # a rank that kept no group has no value to weigh (NaN): only the ranks with groups count
            out[key] = sum(v * g for v, g in have if g) / total if total else sum(v for v, _ in have) / len(have)
    return out


def rollout_records(step: int, samples, adv, G: int) -> list[dict]:
    """One rollouts.jsonl line per completion of the global batch (rank order)."""
    local = [
        {
            "step": step,
            "prompt_id": samples.prompts[i // G].id,
            "prompt": samples.prompts[i // G].problem,
            "answer": samples.prompts[i // G].answer,
            "completion": text,
            "reward": samples.rewards[i].item(),
            "score": samples.scores[i].item(),
            "advantage": adv[i].item(),
            "length": int(samples.comp.lengths[i]),
            "truncated": bool(samples.comp.truncated[i]),
            **(
                {"prefix_len": int(samples.comp.prefix_len[i]), "seed_step": int(samples.comp.seed_step[i])}
                if samples.comp.prefix_len is not None
                else {}
            ),
        }
        for i, text in enumerate(samples.texts)
    ]
    return [r for part in distributed.all_gather(local) for r in part]
