#!/usr/bin/env bash
# AIME 2024 + 2025 the way reasoning papers report it: the `reasoning` preset (temperature 0.6, top-p 0.95,
# long completions), n samples per problem, avg@n (= pass@1 estimated from n samples) and pass@k.
#
#   bash examples/eval_aime.sh runs/qwen-math-lora            # a run directory (its newest checkpoint)
#   bash examples/eval_aime.sh Qwen/Qwen2.5-Math-1.5B 32       # a hub model, n = 32
#
# n >= 16 on AIME: lighteval measured about one point of seed-to-seed spread in avg@16 on its 30 problems.
# Both problem sets ship with thinkrl (docs/evaluation.md): no hub is needed for the data.
set -euo pipefail
MODEL=${1:?usage: bash examples/eval_aime.sh MODEL_OR_RUN_DIR [N]}
N=${2:-16}
thinkrl eval --model "$MODEL" --dataset aime24,aime25 --preset reasoning --n "$N"
