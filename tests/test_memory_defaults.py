"""The memory defaults change memory only: the same run with checkpointing on, off or chosen automatically,
and with or without the start-up allocator settings (glibc's threshold, the CPU block cache), writes the same
metrics and weights, to the bit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_cli_e2e import tiny_args
from typer.testing import CliRunner

from thinkrl import forward
from thinkrl.accel import allocator, kept_outputs
from thinkrl.cli import app
from thinkrl.learner import logprobs, update
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.usefixtures("accel_on")  # tests of the CPU speed-ups themselves


def _numbers(run_dir):
    """Every metric but the clocks, and the final adapter weights."""
    clock = lambda k: k.startswith(("time/", "tokens/s")) or k.endswith("tokens_per_s")  # noqa: E731
    rows = [{k: v for k, v in r.items() if not clock(k)} for r in read_jsonl(run_dir / "metrics.jsonl")]
    weights = load_file(str(next((run_dir / "checkpoints").glob("step-*")) / "adapter" / "adapter_model.safetensors"))
    return rows, weights


def _assert_same(a, b):
    rows_a, w_a = a
    rows_b, w_b = b
    for ra, rb in zip(rows_a, rows_b, strict=True):  # floats compared exactly
        assert ra == rb, {k: (v, rb.get(k)) for k, v in ra.items() if rb.get(k) != v}
    assert w_a.keys() == w_b.keys()
    for name, t in w_a.items():
        assert torch.equal(t, w_b[name]), name


def test_checkpointing_on_off_or_auto_gives_the_same_run(tiny_model_dir, tmp_path, monkeypatch):
    replays = []
    real = forward._checkpointed

    def counted(layers, keep):
        replays.append(keep)
        return real(layers, keep)

    monkeypatch.setattr(forward, "_checkpointed", counted)
    monkeypatch.setattr(update, "ACTIVATION_BUDGET", 0)  # auto: every pass is "too large", so auto checkpoints
    runs = {}
    for name, setting in (("false", "false"), ("true", "true"), ("auto", "auto"), ("keep", "auto")):
        if name == "keep":  # as if the budget held every linear output: the replays reuse them all
            monkeypatch.setattr(kept_outputs, "kept_linears", lambda shapes, *_: frozenset(shapes))
        replays.clear()
        out = tmp_path / name
        extra = ["-o", f"train.gradient_checkpointing={setting}", "-o", "train.mini_batches=2"]
        result = CliRunner().invoke(app, tiny_args(tiny_model_dir, out, 2, *extra), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert bool(replays) == (setting != "false")  # the training passes really recomputed their layers
        assert all(bool(keep) == (name == "keep") for keep in replays)
        runs[name] = _numbers(out)
    assert runs["false"][0][0]["grad_norm"] > 0
    for name in ("true", "auto", "keep"):
        _assert_same(runs["false"], runs[name])


def test_auto_checkpoints_a_pass_once_its_activations_pass_the_budget():
    """auto decides per pass, by padded tokens; true and false are obeyed whatever the size."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from thinkrl.config import Config

    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=50))
    fits = update.ACTIVATION_BUDGET // logprobs.activation_bytes(model.config, 1)  # float32: 4 bytes an element
    for setting, small, large in (("auto", False, True), (True, True, True), (False, False, False)):
        cfg = Config()
        cfg.train.gradient_checkpointing = setting
        ctx = SimpleNamespace(cfg=cfg, policy=model)
        assert update._checkpointing(ctx, fits)[0] is small, setting  # type: ignore[arg-type]
        assert update._checkpointing(ctx, fits + 1)[0] is large, setting  # type: ignore[arg-type]
    half = logprobs.activation_bytes(model.config, 1000, element_size=2)
    assert half * 2 == logprobs.activation_bytes(model.config, 1000)  # bfloat16 keeps half as many bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the allocator setting is glibc's")
def test_allocator_setting_changes_no_number(tiny_model_dir, tmp_path):
    """Two fresh processes, one with the start-up mallopt and the CPU block cache (every block through it,
    not only large ones, so the tiny model's run reuses blocks all the time) and one with neither: the same
    metrics and weights."""
    code = (
        "import sys; from thinkrl.accel import allocator; from thinkrl.cli import app\n"
        "if sys.argv[1] == 'off': allocator.tune = lambda: False\n"
        "allocator.CACHE_MIN = 0\n"
        "app(sys.argv[2:], standalone_mode=False)\n"
        "print('CACHE', allocator.cache_stats())\n"
        "print('TUNED', allocator._done)\n"
    )
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        args = [str(a) for a in tiny_args(tiny_model_dir, out, 2)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", code, mode, *args], capture_output=True, text=True, cwd=str(tmp_path), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        tuned = json.loads(proc.stdout.split("TUNED", 1)[1].strip().lower())
        assert tuned == ([True] if mode == "on" else [])
        cache = proc.stdout.split("CACHE", 1)[1].split("TUNED", 1)[0].strip()
        if mode == "off":
            assert cache == "None"
        elif "CPU block cache is unavailable" not in proc.stderr:  # built here: it ran, and blocks were reused
            assert eval(cache)["hits"] > 1000, cache
        runs[mode] = _numbers(out)
    _assert_same(runs["on"], runs["off"])


def test_allocator_tune_is_once_and_leaves_a_users_own_setting(monkeypatch):
    monkeypatch.setattr(allocator, "_done", [])
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert allocator.tune() is False  # the user's environment wins
    assert allocator.tune() is False  # decided once per process
    monkeypatch.setattr(allocator, "_done", [])
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert allocator.tune() is sys.platform.startswith("linux")
