"""The rollout on the fake device: the engines a GPU run can pick without vLLM (transformers, auto's choice
there, and lean) sample the tiny model on the device with the step's generator (setup.reseed, on the device),
and draw the same completions as on the CPU. transformers decodes in a thread of its own, where the fake's
modes are not active: its factories reach the fake backend's kernels instead."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import make_engine
from thinkrl.setup import reseed

pytestmark = pytest.mark.device


def sample(model_dir, engine: str, device: torch.device):
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval().requires_grad_(False).to(device)
    req = Request([[10, 11, 12], [13, 14]], 2, Sampling(5, 1.0), [1], 0, reseed(3, 1, device), record_topk=3, record_entropy=True)
    return make_engine(engine, device, 8, 64).generate(model, req)


@pytest.mark.parametrize("engine", ["transformers", "lean"])
def test_an_engine_samples_on_the_device(tiny_model_dir, fakegpu, engine):
    on_device = sample(tiny_model_dir, engine, fakegpu)
    on_cpu = sample(tiny_model_dir, engine, torch.device("cpu"))
    assert on_device.tokens.device == on_device.behav_logp.device == on_device.lengths.device == fakegpu
    assert on_device.tokens.tolist() == on_cpu.tokens.tolist()
    torch.testing.assert_close(on_device.behav_logp.cpu(), on_cpu.behav_logp)
    torch.testing.assert_close(on_device.topk_logp.cpu(), on_cpu.topk_logp)
