"""The grid of bench/reproduce.py: per seed paper's claim, the regime every arm runs in, the arms (method and
their own overrides), what is measured and plotted, and the note the report prints under the table."""

from __future__ import annotations

from repro_report import Claim

# the off-policy regime of ctpo/sis/drpo: their recipes' group of 16 and 4 mini-batches, plus a sampler 2 steps behind
OFF_POLICY = ("rollout.group_size=16", "train.mini_batches=4", "rollout.staleness=2")
STABILITY = ("unstable_frac", "grad_cv", "accuracy")
CLAIMS = {
    "ctpo": Claim(
        "ctpo", "stabler off-policy updates than token ratios",
        (*OFF_POLICY, "correction.mode=tis", "correction.level=sequence", "correction.c_max=5.0"),
        "ctpo's recipe (group 16, 4 mini-batches, sequence-level TIS with C = 5) and a sampler 2 steps stale, for every arm: "
        "the three losses see the same off-policy data and the same correction, so only the ratio differs.",
        {"ctpo": ("ctpo", ()), "grpo": ("grpo", ()), "gspo": ("gspo", ())}, STABILITY,
        ("grad_norm", "mismatch/ratio_gt2_frac", "reward/mean", "entropy"),
        "Exploding steps are rare at 40 steps of a LoRA run clipped at grad norm 1 (the norm is taken before the clip), "
        "so the stability rows have little room to separate; accuracy is the same 200 problems for every arm.",
    ),
    "ais": Claim(
        "ais", "recovers what an fp8 sampler loses", ("rollout.precision=fp8",),
        "ais's recipe (sampler weights fake-quantised to fp8, trainer fp32) for every arm; grpo uncorrected and grpo "
        "with token-level TIS (C = 2) as baselines. ais corrects itself, so its arm has correction.mode=none.",
        {"ais": ("ais", ()), "grpo-none": ("grpo", ("correction.mode=none",)), "grpo-tis": ("grpo", ("correction.mode=tis",))},
        ("accuracy", "mismatch_abs", "mismatch_k3"), ("reward/mean", "mismatch/abs_log_ratio", "mismatch/k3", "ais/alpha"),
        "The mismatch rows say how large the fp8 gap is (descriptive: no method changes the sampler). With no arm "
        "sampling at full precision the table says whether ais beats the fp8 baselines, not how much of the gap it closes.",
    ),
    "sis": Claim(
        "sis", "accepted tokens behave on-policy; less variance", OFF_POLICY,
        "sis's recipe (group 16, 4 mini-batches) and a sampler 2 steps stale for every arm (gspo's recipe, 4 mini-batches, is included).",
        {"sis": ("sis", ()), "gspo": ("gspo", ()), "grpo": ("grpo", ())}, ("accept_frac", "accept_corr", "grad_cv", "accuracy"),
        ("sis/accept_frac", "mismatch/abs_log_ratio", "grad_norm", "reward/mean"),
        "The acceptance rows are sis's own: the paper reports 0.80-0.95 accepted, and a test that accepts "
        "on-policy tokens should accept less as the data gets more off-policy (negative correlation over steps).",
    ),
    "stare": Claim(
        "stare", "keeps entropy in a band without losing accuracy",
        ("rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=3", "reward.overlong_buffer=0.2", "reward.overlong_penalty=1.0",
         "train.lr=0.0004"),
        "dapo's recipe (dynamic sampling, overlong shaping) for both arms, which stare's recipe (target entropy 1.5, "
        "dynamic sampling) shares but for the shaping; 60 steps at twice the default lr so that dapo's entropy falls "
        "far (grpo's averages 1.1 nats over the demo's 40 steps and 0.4 over its last 10: docs/thinking_seeds.md).",
        {"stare": ("stare", ()), "dapo": ("dapo", ())}, ("entropy_final", "entropy_min", "accuracy"),
        ("entropy", "reward/mean", "stare/reweighted_frac", "length/mean"),
        "stare's gate is on whenever the batch entropy is under 1.5 nats, which is most of such a run, so this tests "
        "its reweighting (top 10% surprisal positive tokens x 1.1) rather than the gate.",
        steps=60,
    ),
    "drpo": Claim(
        "drpo", "smooth trust region steadier than clipping", OFF_POLICY,
        "drpo's recipe (group 16, 4 mini-batches; its sum-norm aggregation is its own) and a sampler 2 steps stale "
        "for every arm; no rollout correction (drpo and dppo take their ratio against the sampler and refuse one).",
        {"drpo": ("drpo", ()), "grpo": ("grpo", ()), "dppo": ("dppo", ())}, STABILITY,
        ("grad_norm", "mismatch/ratio_gt2_frac", "reward/mean", "entropy"),
        "grpo's ratio is against pi_old (recomputed), drpo's and dppo's against the sampler, as each is used in practice. "
        "drpo's wide accuracy interval is one seed: per seed (the committed results) drpo 0.02 / 0.115 / 0.45, dppo "
        "0.20 / 0.34 / 0.145, grpo 0.315 / 0.415 / 0.46; drpo's seed 0 lost the task (training reward 0 over its last "
        "10 steps, entropy still 0.86). Three seeds cannot say whether that is drpo or chance.",
    ),
    "ict": Claim(
        "ict", "JS-selected tokens keep diversity", (),
        "the defaults (one update per rollout); the grpo arm uses token-mean aggregation like ict, so the token "
        "selection is the only difference (ict with frac = 1 is exactly that grpo).",
        {"ict": ("ict", ()), "grpo": ("grpo", ("method.aggregation=token-mean",))}, ("entropy_mean", "distinct", "accuracy"),
        ("entropy", "answers/distinct_per_group", "reward/mean"),
        "ict trains on 10% of the tokens and keeps the other 90% in the token-mean count, so at grpo's learning rate "
        "its gradient is a small fraction of grpo's (median grad_norm over steps with a gradient 0.02-0.03 vs 0.42-0.63 "
        "in the committed results) and its training reward stays near where it started for all 40 steps while grpo's "
        "rises (plot). Its higher entropy and diversity are those of a policy that barely moved, and so is its lower "
        "accuracy: this miniature does not test the claim fairly. That needs ict at a learning rate or step count "
        "where it learns, which was not run.",
    ),
    "thinking_seeds": Claim(
        "thinking_seeds", "more exploration", (),
        "the defaults with thinking_seeds' recipe (a checkpoint joins the pool every 10 steps, 2 of 8 completions seeded); "
        "its loss hosted on grpo with grpo's aggregation, so the seeding is the only difference (as bench/seeds_compare.py).",
        {"thinking_seeds": ("thinking_seeds", ("method.host=grpo", "method.aggregation=seq-mean-token-mean")), "grpo": ("grpo", ())},
        ("distinct", "entropy_mean", "accuracy"), ("answers/distinct_per_group", "entropy", "reward/mean", "seeds/seeded_frac"),
        "Seeded completions continue older, weaker policies' prefixes, so some extra diversity is built in.",
    ),
}  # fmt: skip
