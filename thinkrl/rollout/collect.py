"""One step's training data: prompts -> G completions each -> verifier scores -> rewards.

Plain GRPO takes the step's prompts in one generation round. With rollout.dynamic_sampling (DAPO), a group
whose scores are all equal carries no gradient, so it is dropped and fresh prompts are sampled in further
rounds until prompts_per_step groups are kept or rollout.max_sampling_rounds is reached (then the step
trains on what it has). The reward used for advantages is reward.functions' weighted sum (thinkrl/verifier/rewards.py;
by default the verifier's score) plus DAPO's soft overlong punishment (reward.overlong_buffer); the verifier
score (accuracy) is kept separately for logging and for the dynamic-sampling test.
With several processes each rank takes its contiguous share of every round's prompts and keeps
prompts_per_step / world groups, so a group never spans ranks.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from thinkrl import distributed
from thinkrl.config import Config
from thinkrl.data import Prompt, step_prompts
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines import Engine
from thinkrl.rollout.seeds import seeded_generate
from thinkrl.verifier.rewards import RewardSet


@dataclass
class StepSamples:
    prompts: list[Prompt]  # the kept prompts, one per group
    comp: Completions  # (P * G, T), group g in rows g*G .. g*G + G - 1
    texts: list[str]  # decoded completions
    scores: Tensor  # (P * G,) verifier scores
    rewards: Tensor  # (P * G,) scores plus shaping
    group_size: int  # G: completions per prompt, what every later stage groups rows by
    stats: dict[str, float] = field(default_factory=dict)


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int, factor: float) -> Tensor:
    """DAPO's soft punishment: 0 up to max - buffer tokens, then falling linearly to -factor at max."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    over = (lengths.float() - (max_new_tokens - buffer)).clamp(min=0)  # (B,)
    return -factor * over / buffer


def _round_prompts(prompts: list[Prompt], step: int, rnd: int, per_step: int, seed: int) -> list[Prompt]:
    if rnd == 0:
        return step_prompts(prompts, step, per_step, seed)
    rng = random.Random((seed * 1_000_003 + step) * 1_009 + rnd)  # extra rounds: seeded by (seed, step, round)
    return [prompts[i] for i in rng.sample(range(len(prompts)), min(per_step, len(prompts)))]


@dataclass(frozen=True)
class RolloutPlan:
    """What a step's sampling reads of the settings: rollout.*, reward.overlong_* and train.seed."""

    sampling: Sampling
    group_size: int  # G
    prompts_per_step: int
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 1
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    seed: int = 0  # train.seed: which prompts the extra dynamic-sampling rounds draw

    @classmethod
    def from_config(cls, cfg: Config) -> RolloutPlan:
        r = cfg.rollout
        sampling = Sampling(r.max_new_tokens, r.temperature, r.top_p, r.top_k, r.min_new_tokens)
        rounds = (r.dynamic_sampling, r.max_sampling_rounds)
        return cls(
            sampling,
            r.group_size,
            r.prompts_per_step,
            *rounds,
            cfg.reward.overlong_tokens(r.max_new_tokens),  # reward.overlong_buffer may be a fraction of the budget
            cfg.reward.overlong_penalty,
            cfg.train.seed,
        )


@dataclass
class RolloutContext:
    """What sampling and scoring a step work with; train.py builds it once."""

    plan: RolloutPlan
    engine: Engine
    sampler: Any  # thinkrl.rollout.policy_copy.PolicySampler
    tok: Any
    pool: Any  # the verifier pool
    rewards: RewardSet  # reward.functions (the verifier's score by default)
    eos: list[int]
    pad: int
    record_topk: int = 0  # the sampler's top-K and entropy, when the sampler stands in for pi_old
    record_entropy: bool = False
    seed_pool: Any = None  # Thinking Seeds' thinkrl.rollout.seeds.SeedPool

    def __post_init__(self) -> None:
        self.engine.bind(self.sampler)  # an engine that loads the policy's adapters itself reads them from the sampler


def _sample_and_grade(ctx: RolloutContext, step: int, batch: list[Prompt], generator, stats: dict):
    """One sampling round: G completions per prompt of `batch`, decoded and scored; adds to `stats`. Returns the
    completions, their texts, the verifier's scores (P, G), the extracted answers and reward.functions' values."""
    tok, G = ctx.tok, ctx.plan.group_size
    t0 = time.perf_counter()
    req = Request([p.ids for p in batch], G, ctx.plan.sampling, ctx.eos, ctx.pad, generator, ctx.record_topk, ctx.record_entropy, step=step)
    if ctx.seed_pool is not None:
        comp = seeded_generate(ctx.engine, ctx.sampler, ctx.seed_pool, step, req, tok)
    else:
        comp = ctx.engine.generate(ctx.sampler.restore(), req)
        stats.update(ctx.engine.stats)
    t1 = time.perf_counter()
    texts = tok.batch_decode([row[m].tolist() for row, m in zip(comp.tokens, comp.mask)], skip_special_tokens=True)
    scores, extracted, parts, vstats = ctx.rewards.evaluate(ctx.pool, texts, [p.answer for p in batch for _ in range(G)])
    stats["time/generate"] += t1 - t0
    stats["time/score"] += time.perf_counter() - t1
    stats["verifier/timeouts"] += vstats["timeouts"]
    stats["verifier/crashes"] += vstats["crashes"]
    stats["verifier/errors"] += vstats.get("errors", 0)
    return comp, texts, torch.tensor(scores, dtype=torch.float32).view(len(batch), G), extracted, parts  # scores (P, G)


def collect(ctx: RolloutContext, step: int, prompts: list[Prompt], generator: torch.Generator) -> StepSamples:
    """The step's kept groups, sampled by ctx.engine with the sampler's last refresh and graded by ctx.pool;
    with a Thinking Seeds pool, part of each group starts from historical prefixes (thinkrl/rollout/seeds.py)."""
    plan, pad, G = ctx.plan, ctx.pad, ctx.plan.group_size
    rank, world = distributed.world()
    target = plan.prompts_per_step // world  # groups this rank keeps
    kept: list[tuple[Prompt, Completions, list[str], Tensor, list[list[float]]]] = []  # last: reward.functions' values
    distinct: list[int] = []  # distinct extracted answers per sampled group: a diversity measure
    stats = {
        "verifier/timeouts": 0,
        "verifier/crashes": 0,
        "verifier/errors": 0,  # the grader or a reward function raised on a completion (scored 0)
        "sampling/rounds": 0,
        "sampling/dropped_groups": 0,
        "time/generate": 0.0,
        "time/score": 0.0,
    }
    for rnd in range(plan.max_sampling_rounds if plan.dynamic_sampling else 1):
        batch = distributed.shard(_round_prompts(prompts, step, rnd, plan.prompts_per_step, plan.seed), rank, world)
        comp, texts, scores, extracted, parts = _sample_and_grade(ctx, step, batch, generator, stats)
        stats["sampling/rounds"] += 1
        distinct += [len({a for a in extracted[g * G : (g + 1) * G] if a is not None}) for g in range(len(batch))]
        for g, p in enumerate(batch):
            if plan.dynamic_sampling and bool((scores[g] == scores[g, 0]).all()):
                stats["sampling/dropped_groups"] += 1
                continue
            rows = torch.arange(g * G, (g + 1) * G)
            kept.append((p, comp.select(rows.to(comp.tokens.device)), texts[g * G : (g + 1) * G], scores[g], parts[g * G : (g + 1) * G]))
        if len(kept) >= target:
            break
    kept = kept[:target]
    stats["sampling/kept_groups"] = len(kept)
    stats["answers/distinct_per_group"] = sum(distinct) / max(len(distinct), 1)
    if not plan.dynamic_sampling:  # one round, nothing dropped: nothing to report
        for k in ("sampling/rounds", "sampling/dropped_groups", "sampling/kept_groups"):
            del stats[k]
    parts = [row for k in kept for row in k[4]]
    stats.update(ctx.rewards.means(parts))  # reward/<name> when reward.functions is set
    if not kept:
        return StepSamples([], None, [], torch.zeros(0), torch.zeros(0), G, stats)
    comp = Completions.cat([k[1] for k in kept], pad)
    scores = torch.cat([k[3] for k in kept])  # (P * G,)
    rewards = torch.tensor(ctx.rewards.totals(parts), dtype=torch.float32)  # (P * G,) the default: = scores
    rewards += overlong_penalty(comp.lengths.cpu(), plan.sampling.max_new_tokens, plan.overlong_buffer, plan.overlong_penalty)
    if ctx.seed_pool is not None:
        stats.update(_seed_stats(comp, scores, ctx.seed_pool))
    return StepSamples([k[0] for k in kept], comp, [t for k in kept for t in k[2]], scores, rewards, G, stats)


def _seed_stats(comp: Completions, scores: Tensor, seed_pool) -> dict[str, float]:
    """Thinking Seeds bookkeeping for metrics.jsonl: pool size, how much was seeded, rewards of each kind."""
    out = {"seeds/pool_size": float(len(seed_pool.entries)), "seeds/seeded_frac": 0.0, "seeds/prefix_len_mean": 0.0}
    if comp.prefix_len is None:
        return out
    seeded = (comp.prefix_len > 0).cpu()  # (B,)
    out["seeds/seeded_frac"] = seeded.float().mean().item()
    if seeded.any():
        out["seeds/prefix_len_mean"] = comp.prefix_len[seeded.to(comp.prefix_len.device)].float().mean().item()
        out["reward/seeded_mean"] = scores[seeded].mean().item()
    if (~seeded).any():
        out["reward/unseeded_mean"] = scores[~seeded].mean().item()
    return out
