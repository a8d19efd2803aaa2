#!/usr/bin/env bash
# Train several methods, each under its own recipe, from one seed on the same data, then plot and tabulate them.
#
# What this compares: each method's whole regime (its recipe changes group size, updates per rollout, rollout
# correction...), one seed each. It shows what the methods look like; it cannot say that one is better. For
# that, run a study: arms in one shared regime on paired seeds, with intervals and the smallest difference the
# seeds can detect (docs/studies.md, examples/study/grpo_vs_dr_grpo.yaml).
#
#   bash examples/compare_methods.sh                                    # grpo, dapo, cispo; bundled model, built-in arithmetic
#   METHODS="grpo gspo ctpo" STEPS=100 bash examples/compare_methods.sh -o rollout.group_size=16
#
# Extra arguments go to every `thinkrl train` (a CONFIG file, -o overrides). Interrupted? Run it again: a
# finished run is left alone and an unfinished one continues from its last checkpoint.
set -euo pipefail
METHODS=${METHODS:-"grpo dapo cispo"}
STEPS=${STEPS:-40}
SEED=${SEED:-0}
OUT=${OUT:-runs/compare}

for method in $METHODS; do
  run="$OUT/$method"
  if [ -f "$run/metrics.jsonl" ]; then
    thinkrl train --resume "$run"
  else
    thinkrl train "$@" --method "$method" --output-dir "$run" -o train.steps="$STEPS" -o train.seed="$SEED"
  fi
done

runs=()
for method in $METHODS; do runs+=("$OUT/$method"); done
thinkrl plot "${runs[@]}" --out "$OUT/compare.png" --smooth 5
thinkrl compare "${runs[@]}"
