"""The examples run as documented (on the tiny model) and the GPU recipe's config is valid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from thinkrl.run.jsonl import read_jsonl
from thinkrl.settings import load_config, resolve

HERE = Path(__file__).resolve().parent


def test_qwen_math_recipe_loads_and_validates():
    cfg = resolve(load_config(HERE / "qwen_math_lora" / "config.yaml"))  # typed, cross-checked; no download
    assert cfg.model.name == "Qwen/Qwen2.5-Math-1.5B" and cfg.model.lora.rank == 64
    assert cfg.method.name == "dapo" and cfg.rollout.dynamic_sampling
    assert cfg.eval.datasets == ["aime24"] and cfg.eval.preset == "reasoning"
    assert cfg.rollout.max_new_tokens + cfg.data.max_prompt_tokens <= 4096  # Qwen2.5-Math's context window


def _env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


@pytest.mark.plain  # the script's runs reach the CPU speed-ups (tests/plain_marks.py)
def test_compare_methods_script_trains_plots_and_tabulates(tiny_model_dir, tmp_path):
    out = tmp_path / "cmp"
    env = {**_env(), "METHODS": "grpo cispo", "STEPS": "2", "OUT": str(out)}
    args = [
        "bash",
        str(HERE / "compare_methods.sh"),
        "--model",
        str(tiny_model_dir),
        "-o",
        "rollout.max_new_tokens=6",
        "-o",
        "rollout.group_size=2",
        "-o",
        "verifier.workers=1",
    ]
    first = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (out / "compare.png").stat().st_size > 0
    assert "grpo" in first.stdout + first.stderr and "cispo" in first.stdout + first.stderr
    again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)  # finished runs are left alone
    assert again.returncode == 0, again.stderr[-2000:]
    assert [m["step"] for m in read_jsonl(out / "grpo" / "metrics.jsonl")] == [1, 2]


def test_eval_aime_script_explains_its_usage():
    proc = subprocess.run(["bash", str(HERE / "eval_aime.sh")], capture_output=True, text=True, env=_env())
    assert proc.returncode != 0 and "usage: bash examples/eval_aime.sh MODEL_OR_RUN_DIR [N]" in proc.stderr
