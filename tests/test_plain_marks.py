"""tests/plain_marks.py keeps the `plain` mark true: a run of the suite fails, naming the test, when an unmarked
fast test reaches a CPU speed-up (directly or in a Python subprocess, whatever environment it is given), and
passes for marked tests, slow tests, tests that set THINKRL_ACCEL themselves, tests that only reach the
allocator settings, subprocesses that import the speed-ups without running one, and the building of a shared
fixture (not the work of the test that happens to run first)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.plain  # it starts pytest in a subprocess, as the tests it judges do

TESTS = Path(__file__).parent

SUITE = """
import os, subprocess, sys
import pytest
from thinkrl import accel

def test_unmarked_reaches_a_hook():
    accel.checkpoint_kwargs(frozenset())

def test_unmarked_starts_python_that_reaches_a_hook():
    code = "from thinkrl import accel; accel.checkpoint_kwargs(frozenset())"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"})  # its own environment too

def test_switch_turned_off_by_the_python_it_starts():
    flip = "os.environ['THINKRL_ACCEL'] = '1' if os.environ.get('THINKRL_ACCEL') == '0' else '0'"  # from what the run has
    code = f"import os; from thinkrl import accel; {flip}; accel.checkpoint_kwargs(frozenset())"
    subprocess.run([sys.executable, "-c", code], check=True)

def test_starts_python_that_reaches_nothing():
    subprocess.run([sys.executable, "-c", "import thinkrl.accel"], check=True)

@pytest.mark.plain
def test_marked():
    accel.checkpoint_kwargs(frozenset())

@pytest.mark.slow
def test_slow_is_not_rerun_by_test_plain():
    accel.checkpoint_kwargs(frozenset())

@pytest.mark.vllm
def test_vllm_is_not_rerun_by_test_plain():
    accel.checkpoint_kwargs(frozenset())

def test_sets_the_switch_itself(monkeypatch):
    monkeypatch.setenv("THINKRL_ACCEL", "1" if os.environ.get("THINKRL_ACCEL") == "0" else "0")  # the other path
    accel.checkpoint_kwargs(frozenset())

def test_allocator_settings_only():
    accel.process_start()

def test_nothing_of_accel():
    assert 1 + 1 == 2

@pytest.fixture(scope="session")
def shared_run():
    accel.checkpoint_kwargs(frozenset())  # a session fixture's work: built for whichever test needs it first

def test_uses_a_session_fixture_that_reaches_a_hook(shared_run):
    assert 1 + 1 == 2
"""


def run_suite(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(body)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    plain: x\n    slow: x\n    vllm: x\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "plain_marks", "-p", "no:cacheprovider", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))} | {"PYTHONPATH": str(TESTS)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_an_unmarked_test_that_reaches_the_speed_ups_fails_the_run_by_name(tmp_path):
    out = run_suite(tmp_path, SUITE)
    report = out.stdout.split("without the `plain` mark")[-1]
    assert out.returncode == 1, out.stdout[-3000:]
    assert "11 passed" in out.stdout
    assert "test_unmarked_reaches_a_hook: thinkrl.accel (checkpoint_kwargs)" in report
    assert "test_unmarked_starts_python_that_reaches_a_hook: a subprocess reached thinkrl.accel (checkpoint_kwargs)" in report
    for name in (
        "marked",
        "slow_is",
        "vllm_is",
        "sets_the_switch",
        "allocator_settings",
        "nothing_of",
        "reaches_nothing",
        "uses_a_session",
    ):
        assert f"test_{name}" not in report, report


def test_a_suite_whose_marks_are_true_passes(tmp_path):
    body = SUITE.replace("def test_unmarked_reaches_a_hook", "@pytest.mark.plain\ndef test_unmarked_reaches_a_hook")
    body = body.replace("def test_unmarked_starts_python", "@pytest.mark.plain\ndef test_unmarked_starts_python")
    out = run_suite(tmp_path, body)
    assert out.returncode == 0 and "11 passed" in out.stdout, out.stdout[-3000:]
