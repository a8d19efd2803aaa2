"""Fixtures of the fake-device tests (make test-device): the fake accelerator of tests/device/fakedevice.py."""

from __future__ import annotations

import pytest
from fakedevice import fake_device


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
