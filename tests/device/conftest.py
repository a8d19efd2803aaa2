"""Fixtures of the fake-device tests (make test-device): the fake accelerator of tests/device/fakedevice.py."""

from __future__ import annotations

import pytest
from fakedevice import fake_device, install


@pytest.fixture
def fakegpu(monkeypatch):
    """fakegpu:0, active for the test. The CPU speed-ups are off (THINKRL_ACCEL=0): on a GPU thinkrl/accel steps
    aside, and the fake stands in for that GPU's path."""
    monkeypatch.setenv("THINKRL_ACCEL", "0")
    # transformers swaps layers for the `kernels` package's hub kernels at model.train(), and that package refuses
    # a device it does not know; those kernels are not thinkrl's code (docs/fake_device.md)
    monkeypatch.setenv("USE_HUB_KERNELS", "0")
    with fake_device() as device:
        yield device


@pytest.hookimpl(trylast=True)  # after -m has deselected: `make test` collects this folder too and must not register
def pytest_collection_modifyitems(config, items):
    """Register the fake backend before any test runs when one of its tests is selected: the autograd engine sizes
    its per-device queues at the first backward of the process, so a CPU backward of an earlier test (pytest
    tests/methods tests/device) would leave fakegpu without one and every later backward there would fail."""
    if any(item.get_closest_marker("device") for item in items):
        install()
