"""Fixtures shared by tests/ and examples/ (the tiny random model), and the suite's settings."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))  # tests/tiny.py, tests/helpers.py
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test-fast` runs one worker per core: one torch thread each, or their thread pools fight over the cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["plain_marks"]  # tests/plain_marks.py: the `plain` mark kept true (make test-plain)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_plain_model_dir(tmp_path_factory) -> Path:
    """Same model without a chat template (exercises the plain prompt template)."""
    from tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-plain"), chat=False)


@pytest.fixture(scope="session")
def checkpointed_run(tiny_model_dir, tmp_path_factory) -> Path:
    """A two-step run of the tiny model with a checkpoint after each step (step-1, step-2). Shared: copy it before
    changing it."""
    from test_cli_e2e import invoke, tiny_args

    out = tmp_path_factory.mktemp("checkpointed") / "run"
    invoke(tiny_args(tiny_model_dir, out, 2, "-o", "train.save_every=1"))
    return out


@pytest.fixture
def accel_on(monkeypatch):
    """For tests of the CPU speed-ups themselves (thinkrl/accel): on, even in a THINKRL_ACCEL=0 run of the suite."""
    monkeypatch.setenv("THINKRL_ACCEL", "1")
