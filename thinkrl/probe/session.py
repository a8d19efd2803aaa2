"""A whole probe from a config: model, rollouts, the stale steps, the reference, the replicates, the summary.

The config is a training config (defaults, a file, -o), with no recipe: the probe's regime is shared by every
method it probes, as a study's is. The methods are built with their own default parameters.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from pathlib import Path

import torch

from thinkrl import setup
from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.methods import get_method
from thinkrl.models import eos_ids, load_policy, load_tokenizer, resolve_path
from thinkrl.probe.measure import ProbeSettings, as_arm, check_method, directions, log_ratio_sd, probe_pass, stale_steps
from thinkrl.probe.replicates import replicate_rows, run_replicates
from thinkrl.probe.rollouts import Rollouts
from thinkrl.rollout.collect import RolloutContext, RolloutPlan, StepSamples, collect
from thinkrl.rollout.completions import Completions
from thinkrl.rollout.engines import check_engine, engine_for_run
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.run.checkpoint import load_weights_into
from thinkrl.run.console import console, progress
from thinkrl.verifier import load_grader
from thinkrl.verifier.rewards import RewardSet
from thinkrl.verifier.shielded import ShieldedPool

MAX_ROUNDS = 8


def run_probe(
    cfg: Config, ps: ProbeSettings, checkpoint: Path | None = None, renyi: bool = False
) -> tuple[list[dict[str, dict]], dict[str, float]]:
    """One start's replicates' measurements, and what its starting point looked like (for the report).
    `checkpoint`: a run's checkpoint to start from (its weights on cfg's model); ps.seed: this start's seed (its
    prompts, rollouts and LoRA init); renyi: measure the Renyi-2 entropy's slope too."""
    budget = cfg.rollout.max_new_tokens
    methods = [as_arm(a).resolved(budget, 1.0).build() for a in ps.methods]  # a bad method or parameter fails here, before loading
    for m in methods:
        check_method(m)
    check_engine(cfg.rollout.engine)  # a missing vLLM: before the model loads
    t0 = time.perf_counter()
    tok = load_tokenizer(resolve_path(cfg.model.name))
    prompts, _ = setup.prepare_data(cfg, tok)
    rewards = RewardSet(cfg.reward.functions, cfg.reward.max_failure_share)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    setup.reseed(ps.seed, 0, device)  # the LoRA init, as a run with train.seed = ps.seed
    policy, tok = load_policy(cfg.model, device)
    if checkpoint is not None:
        load_weights_into(policy, checkpoint)
    params = [p for p in policy.parameters() if p.requires_grad]
    engine = engine_for_run(cfg, device, policy)
    sampler = PolicySampler(policy, cfg.rollout.precision)
    plan, pad, temperature = RolloutPlan.from_config(cfg), tok.pad_token_id, cfg.rollout.temperature
    try:
        with ShieldedPool(cfg.verifier.workers, cfg.verifier.timeout, grade_fn=load_grader(cfg.verifier.grader)) as pool:
            eos = eos_ids(policy, tok)
            want = ps.stale_prompts + ps.replicates * ps.groups  # the stale batch, then every replicate's groups
            ctx = RolloutContext(plan, engine, sampler, tok, pool, rewards, eos, pad)
            sampler.refresh()
            order = random.Random(ps.seed).sample(prompts, len(prompts))  # every round and the reference: prompts not used before
            sampled, used = _groups_with_spread(ctx, order, want, ps.seed, device)
            t_sampled = time.perf_counter()
            theta0 = [p.detach().clone() for p in params] if ps.stale_updates else None
            with probe_pass(policy):
                data = _starting_rollouts(sampled, policy, pad, cfg, ps, methods)
                stale_steps(policy, params, data, torch.arange(ps.stale_prompts), get_method("grpo"), cfg, ps.stale_updates)
                # on up to 16 of the replicates' groups: the tokens the arms are measured on, not those the stale steps fit
                drift = log_ratio_sd(policy, data, ps.stale_prompts + torch.arange(min(16, ps.replicates * ps.groups)))
            fresh = _reference(ctx, policy, order[used:], ps, device)
    finally:
        engine.close()
    ref = Rollouts(fresh, policy, pad, temperature)
    with probe_pass(policy):
        d, kl = directions(policy, params, ref, theta0, renyi)
    arms = tuple(as_arm(a).resolved(budget, drift) for a in ps.methods)  # drift-scaled parameters: this start's
    start = {**_begin(data, fresh, d, kl, drift, arms), "sampling_seconds": t_sampled - t0, "setup_seconds": time.perf_counter() - t0}
    G = data.s.group_size
    console.print(
        f"probe: {ps.stale_updates} grpo steps on {ps.stale_prompts} x {G} rollouts, a reference of {ps.reference_prompts} x {G}, "
        f"{ps.replicates} replicates of {ps.groups} x {G}"
    )
    with progress() as bar:
        task = bar.add_task("probe", total=ps.replicates, info=", ".join(a.label for a in arms))
        results = run_replicates(policy, params, data, d, replace(ps, methods=arms), lambda n: bar.advance(task, n))
    start["seconds"] = time.perf_counter() - t0
    return results, start


def _begin(data: Rollouts, fresh: StepSamples, d, kl: float, drift: float, arms) -> dict:
    """What this start's probed policy looked like, for the report."""
    return {
        "reward_mean": float(data.s.rewards.mean()),
        "reference_reward_mean": float(fresh.rewards.mean()),
        "reference_grad_norm": float(d.g_ref.norm()),
        "kl_start_to_probed": kl,  # KL(theta0 || theta1) over the reference positions: how far the stale steps went
        "sampler_k3": data.mismatch_k3(),  # KL(mu || pi_old) per token: 0 unless pi_old is recomputed (an fp8 sampler)
        "log_ratio_sd": drift,  # sd of log theta1 / pi_old per replicate token: how far the stale steps moved
        "answer_tokens": float(data.s.comp.lengths.float().mean()),
        "arms": {a.label: dict(a.params) for a in arms},
    }


def _reference(ctx: RolloutContext, policy, order: list, ps: ProbeSettings, device) -> StepSamples:
    """theta1's fresh rollouts for the reference gradient, sampled at the trainer's precision whatever the
    sampler's (the gradient every arm is held against is the true policy's), and, like the replicates, only
    groups with a reward spread: the others add nothing to it."""
    if ctx.sampler.precision != "same":
        ctx = replace(ctx, sampler=PolicySampler(policy, "same"))
    ctx.sampler.refresh()
    fresh, _ = _groups_with_spread(ctx, order, ps.reference_prompts, ps.seed, device, stream=2_000)
    return fresh


def _starting_rollouts(sampled: StepSamples, policy, pad: int, cfg: Config, ps: ProbeSettings, methods: list) -> Rollouts:
    """The replicates' rollouts with what pi_old (the starting weights, still in place) gives the methods that
    read it: its log-probs (recomputed, or the sampler's), its entropy, its JS scores over each replicate's batch,
    its top-K (sis's proposal)."""
    needs_old_entropy = any("old_entropy" in m.requires for m in methods)
    data = Rollouts(sampled, policy, pad, cfg.rollout.temperature, needs_old_entropy)
    if ps.old_policy == "recompute":
        data.recompute_old(policy)
    js_method = next((m for m in methods if "token_js" in m.requires), None)
    if js_method is not None:
        data.score_js(policy, cfg, js_method, replicate_rows(data, ps))
    widths = {m.topk_width for m in methods if "topk_ids" in m.requires}
    if len(widths) > 1:
        raise UserError(f"the probed methods read top-K proposals of different K ({sorted(widths)}): give them one K")
    if widths:
        data.record_topk(policy, widths.pop())
    return data


def _groups_with_spread(ctx: RolloutContext, order: list, want: int, seed: int, device, stream: int = 1_000) -> tuple[StepSamples, int]:
    """`want` groups whose rewards differ (a group with one reward has no advantage: no method gets a gradient
    from it), sampled in rounds over `order`, each round sized by the share that had a spread so far; and how
    many prompts of `order` that used. `stream`: where the rounds' RNG seeds start."""
    parts: list[StepSamples] = []
    kept, used = 0, 0
    for rnd in range(MAX_ROUNDS):
        share = kept / used if used else 1.0  # the first round asks for what is needed; later ones for the shortfall
        ask = max(8, math.ceil((want - kept) / max(share, 0.05) * 1.1))
        batch = order[used : used + ask]
        if not batch:
            break
        ctx.plan = replace(ctx.plan, prompts_per_step=len(batch), dynamic_sampling=True, max_sampling_rounds=1)
        # one collect per round, minutes on a CPU: say what it is doing
        console.print(f"probe: sampling {len(batch)} prompt groups for {want - kept} more with a reward spread (round {rnd + 1})")
        got = collect(ctx, 0, batch, setup.reseed(seed, stream + rnd, device))
        parts.append(got)
        kept, used = kept + len(got.prompts), used + len(batch)
        if kept >= want:
            return _join(parts, want, ctx.pad), used
    raise UserError(
        f"only {kept} of {used} sampled prompt groups had a reward spread ({want} needed): the starting policy solves (almost) "
        "none or all of them. Start from a trained run (--from RUN_DIR), or ask for fewer --replicates or --reference-prompts"
    )


def _join(parts: list[StepSamples], n: int, pad: int) -> StepSamples:
    """The first n groups of several rounds as one StepSamples."""
    G = parts[0].group_size
    prompts = [p for s in parts for p in s.prompts][:n]
    comp = Completions.cat([s.comp for s in parts if s.prompts], pad).select(torch.arange(n * G))
    rewards, scores = torch.cat([s.rewards for s in parts])[: n * G], torch.cat([s.scores for s in parts])[: n * G]
    return StepSamples(prompts, comp, [t for s in parts for t in s.texts][: n * G], scores, rewards, G)
