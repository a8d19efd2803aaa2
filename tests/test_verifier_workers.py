"""Verifier worker processes: a killed worker is replaced and its sample counted, the memory cap turns an
allocation into a zero score, the trainer process never parses a completion itself, and the workers live and
die with the trainer. (Hostile completion texts: test_hostile.py.)"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import thinkrl.verifier as verifier
from thinkrl.verifier import VerifierPool

TESTS = Path(__file__).parent


def hungry_grade(completion: str, answer: str):
    """A grader that asks for 1 GiB: under the pool's memory cap this raises MemoryError (score 0)."""
    block = bytearray(1 << 30)
    return 1.0, f"allocated {len(block)} bytes"


def _wait_dead(pid: int, limit: float = 10.0) -> bool:
    """True once `pid` has exited: gone, or a zombie nobody reaped yet (Linux /proc)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process states from /proc")


def test_a_worker_killed_mid_sample_is_replaced_and_its_sample_scores_zero():
    from helpers import sleepy_grade

    with VerifierPool(workers=2, timeout=60, grade_fn=sleepy_grade) as pool:
        victim = pool.pids[0]  # slot 0 takes the first sample, the one that sleeps
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        start = time.monotonic()
        scores, extracted, stats = pool.grade(["sleep", "\\boxed{3}", "\\boxed{4}"], ["1", "3", "4"])
        elapsed = time.monotonic() - start
        assert scores == [0.0, 1.0, 1.0] and extracted[0] is None
        assert stats == {"timeouts": 0, "crashes": 1, "errors": 0}
        assert elapsed < 60  # noticed by the pipe closing, not by the 60 s time limit
        assert victim not in pool.pids and len(pool.pids) == 2
        assert pool.score(["\\boxed{3}", "\\boxed{5}"], ["3", "5"]) == ([1.0, 1.0], {"timeouts": 0, "crashes": 0, "errors": 0})


@linux_only
def test_a_worker_killed_while_idle_is_replaced_and_no_sample_is_lost():
    with VerifierPool(workers=2, timeout=10) as pool:
        victim = pool.pids[0]
        os.kill(victim, signal.SIGKILL)
        assert _wait_dead(victim)
        scores, stats = pool.score(["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"], ["1", "2", "3"])
    assert scores == [1.0, 1.0, 1.0]  # the sample meant for the dead worker went to its replacement
    assert stats == {"timeouts": 0, "crashes": 1, "errors": 0}


def test_the_memory_cap_turns_an_allocation_into_a_zero_score():
    with VerifierPool(workers=1, timeout=30, memory_mb=512, grade_fn=hungry_grade) as pool:
        scores, extracted, stats = pool.grade(["anything"], ["1"])
    assert scores == [0.0] and extracted == [None]
    assert stats == {"timeouts": 0, "crashes": 0, "errors": 1}  # MemoryError inside the worker (counted), which lives on


def test_the_trainer_process_never_parses_a_completion(monkeypatch):
    """Every parser the grader uses raises in this (the trainer's) process, and grading still works:
    the workers are spawned, import fresh modules, and do all the parsing."""
    import latex2sympy2_extended
    import math_verify
    import sympy
    import sympy.parsing.sympy_parser

    calls = []

    def forbidden(*args, **kwargs):
        calls.append(args[:1])
        raise AssertionError("parsed in the trainer process")

    for module, name in [
        (math_verify, "parse"),
        (math_verify, "verify"),
        (sympy, "sympify"),
        (sympy, "parse_expr"),
        (sympy.parsing.sympy_parser, "parse_expr"),
        (latex2sympy2_extended, "latex2sympy"),
        (verifier, "extract_boxed"),
        (verifier, "score"),
        (verifier.grading, "extract_boxed"),  # the package re-exports them: both names
        (verifier.grading, "score"),
    ]:
        monkeypatch.setattr(module, name, forbidden)
    # the grader itself: a stand-in that pickles under the real one's name, so each worker imports the real one
    fake_grade = lambda completion, answer: forbidden(completion)  # noqa: E731
    fake_grade.__module__, fake_grade.__qualname__ = "thinkrl.verifier", "grade"
    monkeypatch.setattr(verifier, "grade", fake_grade)
    with VerifierPool(workers=1, timeout=10, grade_fn=verifier.grade) as pool:
        scores, extracted, stats = pool.grade(["\\boxed{\\frac{1}{2}}", "The answer is 42.", "\\boxed{7}"], ["0.5", "42", "8"])
    assert scores == [1.0, 1.0, 0.0] and extracted[2] == "7"
    assert calls == [] and stats == {"timeouts": 0, "crashes": 0, "errors": 0}


def test_a_process_that_only_uses_the_pool_never_imports_sympy():
    code = (
        "import sys, json\n"
        "from thinkrl.verifier import VerifierPool\n"
        "with VerifierPool(workers=1, timeout=10) as pool:\n"
        "    scores, _ = pool.score(['\\\\boxed{2}', 'so 9^9^9^9^9'], ['2', '0.5'])\n"
        "mods = ('sympy', 'math_verify', 'latex2sympy2_extended')\n"
        "print(json.dumps({'scores': scores, 'loaded': sorted(m for m in mods if m in sys.modules)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=TESTS.parent)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"scores": [1.0, 0.0], "loaded": []}


@pytest.mark.plain
def test_training_never_parses_in_the_trainer_process(tiny_model_dir, tmp_path, monkeypatch):
    """A CLI training run with the default grader (and periodic eval) while every parser raises here."""
    import math_verify
    from typer.testing import CliRunner

    from thinkrl.cli import app

    calls = []

    def forbidden(*args, **kwargs):
        calls.append(args[:1])
        raise AssertionError("parsed in the trainer process")

    monkeypatch.setattr(math_verify, "parse", forbidden)
    monkeypatch.setattr(math_verify, "verify", forbidden)
    out = tmp_path / "run"
    overrides = [
        "train.steps=1", "rollout.max_new_tokens=8", "rollout.group_size=2", "rollout.prompts_per_step=2", "verifier.workers=1",
        "data.arith.train_size=100", "data.arith.test_size=20", "data.arith.min_value=1", "data.arith.max_value=40",
        "eval.every=1", "eval.limit=2",
    ]  # fmt: skip
    args = ["train", "--model", str(tiny_model_dir), "--output-dir", str(out), *[a for o in overrides for a in ("-o", o)]]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert calls == [] and (out / "metrics.jsonl").is_file()


@linux_only  # and PR_SET_PDEATHSIG is Linux's
def test_a_killed_trainer_takes_its_workers_with_it_and_ctrl_c_does_not():
    """Workers ignore SIGINT and SIGTERM (Ctrl-C and a scheduler signal the whole process group, and the
    trainer's graceful stop still needs them) and die with the trainer, even one busy with a sample that
    never ends."""
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from helpers import sleepy_grade\n"
        "from thinkrl.verifier import VerifierPool\n"
        "pool = VerifierPool(workers=2, timeout=300, grade_fn=sleepy_grade)\n"
        "print(*pool.pids, flush=True)\n"
        "pool.grade(['sleep'], ['1'])\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=TESTS.parent)
    try:
        pids = [int(p) for p in trainer.stdout.readline().split()]
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, signal.SIGINT)
            os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)
        assert not any(_wait_dead(pid, 0.1) for pid in pids), "a worker died of SIGINT or SIGTERM"
        trainer.kill()
        trainer.wait(10)
        assert all(_wait_dead(pid) for pid in pids), "a worker outlived the trainer"
    finally:
        trainer.kill()
        trainer.wait(10)


def test_a_pool_left_open_does_not_hang_the_exit():
    """multiprocessing's exit hook SIGTERMs daemon workers and waits; ours ignore SIGTERM, so the pool
    closes itself first."""
    code = (
        "from thinkrl.verifier import VerifierPool\n"
        "pool = VerifierPool(workers=2, timeout=5)\n"
        "print(pool.score(['\\\\boxed{1}'], ['1'])[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=TESTS.parent)
    assert out.returncode == 0 and out.stdout.strip() == "[1.0]", out.stderr
