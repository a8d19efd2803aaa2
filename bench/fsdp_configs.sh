#!/usr/bin/env bash
# Every shipped config trained for real under an accelerate config, as a user would launch it: 2 processes,
# 2 steps of `thinkrl train configs/NAME.yaml` on the tiny test model with LoRA, short completions. The
# update-level comparison with one process is tests/test_parallel_matrix.py; this is the whole loop (rollout,
# grading, the pi_old / reference passes, checkpoints) per config. About 30 s a config on 2 CPU cores.
#
#   bench/fsdp_configs.sh [configs/accelerate/fsdp.yaml|ddp.yaml] [OUT_DIR]     prints one line per config
set -uo pipefail
cd "$(dirname "$0")/.."
launch_config=${1:-configs/accelerate/fsdp.yaml}
out=${2:-$(mktemp -d)}
py=${PYTHON:-.venv/bin/python}
model=$("$py" -c "import sys; sys.path.insert(0, 'tests'); from tiny import build_tiny_model; print(build_tiny_model('$out/tiny'))")
failed=0
for config in configs/*.yaml; do
    name=$(basename "$config" .yaml)
    start=$SECONDS
    if OMP_NUM_THREADS=1 "$py" -m accelerate.commands.launch --main_process_port 0 --config_file "$launch_config" \
        -m thinkrl train "$config" --model "$model" -O "$out/$name" -o train.steps=2 -o rollout.max_new_tokens=16 \
        -o verifier.workers=1 > "$out/$name.log" 2>&1; then
        steps=$(wc -l < "$out/$name/metrics.jsonl")
        echo "$name: ok, $steps steps logged ($((SECONDS - start)) s)"
    else
        failed=1
        echo "$name: FAILED ($((SECONDS - start)) s): $(grep -m1 -E '^error:|Error' "$out/$name.log")"
    fi
done
exit $failed
