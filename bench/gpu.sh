#!/usr/bin/env bash
# The GPU check on one GPU, in at most about 12 minutes: the engines and the 1.5B LoRA step (bench/gpu_check.py),
# then the layouts beyond one GPU (bench/gpu_layouts.py: the 7B FSDP2 plan, the vLLM server layout when vLLM is
# installed, FSDP2 for real and the method matrix under fsdp.yaml and ddp.yaml when there are 2 GPUs or more;
# each part says "not run" and why otherwise).
#
#   bench/gpu.sh --prepare     here, once: math-verify and its pure-Python needs as wheels in .whl/, and the
#                              SmolLM2 tokenizer files in .gpu/tokenizer/ (both ignored through .git/info/exclude)
#   bench/gpu.sh               on the GPU machine (the device tool: carry .whl and .gpu); writes $OUT/gpu.md
#                              and $OUT/layouts.md
#
# The device image has torch, transformers, peft, accelerate, typer and rich; vLLM is too large to carry, so
# there the check covers the lean and transformers engines and the server layout says "not run".
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
    mkdir -p .git/info && touch .git/info/exclude
    grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
    grep -qx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
    for pkg in math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl "$pkg"
    done
    mkdir -p .gpu/tokenizer
    src=$(.venv/bin/python -c 'from thinkrl.models import resolve_path; print(resolve_path("smollm2-135m"))')
    cp "$src"/tokenizer* "$src"/special_tokens_map.json .gpu/tokenizer/ 2>/dev/null || cp "$src"/tokenizer* .gpu/tokenizer/
    du -sh .whl .gpu
    exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" THINKRL_TOKENIZER_DIR="$PWD/.gpu/tokenizer" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 bench/gpu_check.py --out "${OUT:-/tmp/thinkrl-gpu}"
python3 bench/gpu_layouts.py --out "${OUT:-/tmp/thinkrl-gpu}"
