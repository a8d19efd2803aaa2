"""Which tests reach the CPU speed-ups, so that `make test-plain` reruns exactly those with THINKRL_ACCEL=0.

A test whose computation takes another path with the speed-ups off (thinkrl/accel: packed weights, fused LoRA,
kept outputs, the decode kernel, split gradients) carries the `plain` mark; `make test-plain` reruns the marked
fast tests as a GPU would run them and skips the rest, whose code is the same either way. This plugin keeps the
marks true: it watches `thinkrl.accel.switch.enabled()`, in this process and in every Python process a test
starts (a sitecustomize.py on their PYTHONPATH does the same there), and a run of the suite fails when an
unmarked fast test reached it; the report names each test and the fix.

Not counted: `accel.process_start` (allocator settings, no number changes), the building of a module- or
session-wide fixture (shared by its tests, built for whichever runs first), a child process that sets
THINKRL_ACCEL itself (thinkrl/sharding.py turns the speed-ups off under FSDP), a test that sets THINKRL_ACCEL in
this process itself (it runs both paths, or the one it names: tests/test_accel_switch.py, the accel_on
fixture), slow tests (test-plain runs fast tests only) and vLLM tests (test-plain's venv has no vLLM; the
vLLM suite's bfloat16 run is the plain path already).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MARK = "plain"
NOT_A_PATH = {"process_start"}  # the hooks that read the switch without changing what is computed
SEEN = "THINKRL_ACCEL_SEEN"  # where a child process writes the first hook that read the switch

# Loaded by every Python process a test starts: wraps the switch as it is imported there.
CHILD = f'''
import importlib.machinery, os, sys

class _Watch:
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path) if name == "thinkrl.accel.switch" else None
        if spec is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                plain, told, start = module.enabled, [], os.environ.get("THINKRL_ACCEL")

                def enabled():
                    caller = sys._getframe(1).f_code.co_name
                    chose = os.environ.get("THINKRL_ACCEL") != start  # the process set the switch itself (FSDP does)
                    if not told and not chose and caller not in {sorted(NOT_A_PATH)!r}:
                        told.append(caller)
                        with open(os.environ["{SEEN}"], "a") as f:
                            f.write(caller + "\\n")
                    return plain()

                module.enabled = enabled

            spec.loader.exec_module = exec_module
        return spec

if os.environ.get("{SEEN}"):
    sys.meta_path.insert(0, _Watch())
'''

_current: pytest.Item | None = None
_session_value = os.environ.get("THINKRL_ACCEL")
_unmarked: list[str] = []
_worker = False  # under pytest-xdist the controller gathers the reports and judges; its workers only record
_child_dir: Path | None = None


def _touched(item: pytest.Item, why: str) -> None:
    if not any(k == "accel_touched" for k, _ in item.user_properties):
        item.user_properties.append(("accel_touched", why))


def _watch_switch() -> None:
    import thinkrl.accel  # noqa: F401 (binds `enabled` in the modules that use it)
    from thinkrl.accel import switch

    plain = switch.enabled
    if getattr(plain, "watched", False):
        return

    def enabled() -> bool:
        caller = sys._getframe(1).f_code.co_name
        same_switch = os.environ.get("THINKRL_ACCEL") == _session_value  # else the test chose the path itself
        if _current is not None and caller not in NOT_A_PATH and same_switch:
            _touched(_current, f"thinkrl.accel ({caller})")
        return plain()

    enabled.watched = True  # type: ignore[attr-defined]
    for module in list(sys.modules.values()):  # every `from thinkrl.accel.switch import enabled` made so far
        if getattr(module, "__name__", "").startswith("thinkrl") and getattr(module, "enabled", None) is plain:
            module.enabled = enabled  # type: ignore[attr-defined]


def _with_child_watch(env: dict) -> dict:
    """A subprocess's explicit environment, with the watch added (its PYTHONPATH first, where it has one)."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_child_dir), env.get("PYTHONPATH")) if p)
    if SEEN in os.environ:
        env.setdefault(SEEN, os.environ[SEEN])
    return env


_popen_init = subprocess.Popen.__init__


def _watched_popen_init(self, args, *rest, **kwargs):
    if kwargs.get("env") is not None and _child_dir is not None:
        kwargs["env"] = _with_child_watch(kwargs["env"])
    _popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    global _worker, _child_dir
    _worker = hasattr(config, "workerinput")
    _watch_switch()
    _child_dir = Path(tempfile.mkdtemp(prefix="thinkrl-plain-marks-"))
    (_child_dir / "sitecustomize.py").write_text(CHILD)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_child_dir), os.environ.get("PYTHONPATH")) if p)
    subprocess.Popen.__init__ = _watched_popen_init  # type: ignore[method-assign]


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
    if _child_dir is not None:
        shutil.rmtree(_child_dir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    _current = item
    seen = _child_dir / f"seen-{os.getpid()}-{id(item)}"  # type: ignore[operator]
    os.environ[SEEN] = str(seen)
    yield
    os.environ.pop(SEEN, None)
    seen.unlink(missing_ok=True)
    _current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A module- or session-wide fixture is built for whichever of its tests runs first (an order xdist varies):
    what it reaches is not that test's, so nothing is counted while it is built."""
    global _current
    if fixturedef.scope == "function":
        yield
        return
    held, seen = _current, os.environ.pop(SEEN, None)
    _current = None
    try:
        yield
    finally:
        _current = held
        if seen is not None:
            os.environ[SEEN] = seen


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Before the call's report is made: what the test's subprocesses saw (they wrote it by now, or never)."""
    seen = Path(os.environ.get(SEEN, ""))
    if call.when == "call" and seen.name and seen.is_file() and os.environ.get("THINKRL_ACCEL") == _session_value:
        _touched(item, f"a subprocess reached thinkrl.accel ({seen.read_text().split()[0]})")
    yield


def pytest_runtest_logreport(report):
    """Runs where results are gathered (the controller, under xdist), from each test's call report."""
    if _worker or report.when != "call" or report.skipped:
        return
    touched = dict(report.user_properties).get("accel_touched")
    if touched and MARK not in report.keywords and not {"slow", "vllm"} & set(report.keywords):
        _unmarked.append(f"{report.nodeid}: {touched}")


def pytest_sessionfinish(session, exitstatus):
    if _unmarked and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _unmarked:
        terminalreporter.section("tests that reach thinkrl.accel without the `plain` mark", red=True)
        for line in _unmarked:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            "mark each with @pytest.mark.plain (or its module with pytestmark): make test-plain reruns them with THINKRL_ACCEL=0"
        )
