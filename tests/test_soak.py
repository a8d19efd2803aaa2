"""Fault-injection soak: a 60-step run on the tiny model, SIGKILLed again and again (at every kill point of
tests/killpoints.py once, in a random order and at a random call, plus at random moments from outside)
and resumed each time until it finishes. It must end exactly where an uninterrupted run ends: one
metrics line per step with the same values, the same rollouts, bitwise-identical weights and optimizer.
After every kill the run directory must already be consistent: every visible checkpoint whole and
loadable, metrics.jsonl readable with one line per step up to at least the newest checkpoint.

THINKRL_SOAK_SEED=N picks another schedule (the seed is printed on failure).
"""

import json
import os
import random
import time

import pytest
import torch
from killpoints import KINDS, run
from safetensors.torch import load_file
from test_cli_e2e import tiny_args

from thinkrl.run import checkpoint
from thinkrl.run.jsonl import read_jsonl

STEPS = 60
DETERMINISTIC = ["step", "reward/mean", "loss", "grad_norm", "entropy", "length/mean"]
ROLLOUT_FIELDS = ["step", "prompt_id", "completion", "reward", "advantage", "length"]
# calls of each hook per training step (with save_every=1, keep_last=2 and rollouts logged every step), so
# that a kill at call N lands within the first few steps of a life
PER_STEP = {
    "generate": 1,
    "grade": 1,
    "update": 1,
    "log": 2,
    "save_weights": 1,
    "torch.save": 3,
    "replace-before": 2,
    "replace-after": 2,
    "rmtree": 1,
}
TIMED_KILLS = 2
TIMED_MAX_STEPS = 12  # a timed life is killed by then at the latest


def steps_done(run_dir):
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def fields(path, keys):
    return [{k: r[k] for k in keys} for r in read_jsonl(path)] if path.exists() else []


def tensors(ckpt):
    weights = load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))
    optimizer = checkpoint._load_pt(ckpt / "optimizer.pt")
    return weights, [t for state in optimizer["state"].values() for t in state.values()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def check_consistent(out, reference, what):
    """The run directory right after a kill: what a resume (or `thinkrl eval`) would find."""
    ckpts = checkpoint.complete_checkpoints(out)
    for c in ckpts:  # every visible checkpoint is whole and loads without unpickling objects
        assert json.loads((c / "trainer_state.json").read_text())["step"] == int(c.name.split("-")[1]), what
        tensors(c)
        for name in ("scheduler.pt", "method.pt"):
            checkpoint._load_pt(c / name)
    newest = int(ckpts[-1].name.split("-")[1]) if ckpts else 0
    metrics = fields(out / "metrics.jsonl", DETERMINISTIC)
    assert [m["step"] for m in metrics] == list(range(1, len(metrics) + 1)), f"{what}: steps {[m['step'] for m in metrics]}"
    assert len(metrics) >= newest, f"{what}: metrics end at step {len(metrics)}, behind checkpoint step-{newest}"
    assert metrics == reference[: len(metrics)], f"{what}: metrics differ from the uninterrupted run"


@pytest.mark.slow
def test_soak_sigkill_at_random_points_and_resume_until_done(tiny_model_dir, tmp_path):
    seed = int(os.environ.get("THINKRL_SOAK_SEED", "20250101"))
    rng = random.Random(seed)
    options = ["-o", "train.save_every=1", "-o", "train.keep_last=2"]
    started = time.monotonic()
    rc, log = run(tiny_args(tiny_model_dir, tmp_path / "straight", STEPS, *options), tmp_path / "straight")
    assert rc == 0, log[-3000:]
    whole_run = time.monotonic() - started
    reference = fields(tmp_path / "straight" / "metrics.jsonl", DETERMINISTIC)
    reference_rollouts = fields(tmp_path / "straight" / "rollouts.jsonl", ROLLOUT_FIELDS)
    assert len(reference) == STEPS

    # each hook once, in a random order, at a random call within its life's first 3 steps; the timed kills
    # come first, at a random moment of start-up or of the first TIMED_MAX_STEPS steps. Together they stay
    # below STEPS, so every hook life still has steps to run.
    lives: list[tuple[str | None, float | None]] = [
        (f"{k}:{rng.randint(1, 3 * PER_STEP[k])}", None) for k in rng.sample(list(KINDS), len(KINDS))
    ]
    for _ in range(TIMED_KILLS):
        lives.insert(rng.randint(0, 2), (None, rng.uniform(0.05, 0.4) * whole_run))
    lives.append((None, None))  # the last life runs to the end
    assert TIMED_KILLS * TIMED_MAX_STEPS + 3 * len(KINDS) < STEPS

    out, history = tmp_path / "soak", []
    for i, (kill, delay) in enumerate(lives):
        fresh = not (out / "config.yaml").is_file()  # a life killed before it wrote the config starts over
        life = tiny_args(tiny_model_dir, out, STEPS, *options) if fresh else ["train", "--resume", out]
        what = f"seed {seed}, life {i} (" + (kill or (f"killed from outside after {delay:.1f} s at most" if delay else "to the end")) + ")"
        t0, before = time.monotonic(), steps_done(out)

        def stop(before=before):
            return steps_done(out) >= before + TIMED_MAX_STEPS

        rc, log = run(life, out, kill=kill, delay=delay, stop_when=stop, log=tmp_path / f"life-{i}.log")
        history.append(f"{what}: exit {rc} after {time.monotonic() - t0:.1f} s, metrics up to step {steps_done(out)}")
        if kill or delay:
            assert rc == -9, f"{what}: not killed (exit {rc}):\n{log[-3000:]}"
            if kill:
                assert f"killpoint {kill.replace(':', ' ')}" in log, f"{what}: the hook never fired"
            check_consistent(out, reference, what)
        else:
            assert rc == 0, f"{what}:\n{log[-3000:]}"
    print(f"uninterrupted run {whole_run:.1f} s; " + "\n".join(history))

    assert fields(out / "metrics.jsonl", DETERMINISTIC) == reference
    assert fields(out / "rollouts.jsonl", ROLLOUT_FIELDS) == reference_rollouts
    final, straight = tensors(out / "checkpoints" / f"step-{STEPS}"), tensors(tmp_path / "straight" / "checkpoints" / f"step-{STEPS}")
    assert final[0].keys() == straight[0].keys() and same(final[0].values(), straight[0].values()), "final adapter weights differ"
    assert same(final[1], straight[1]), "final optimizer state differs"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{STEPS - 1}", f"step-{STEPS}"]  # no leftovers
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
