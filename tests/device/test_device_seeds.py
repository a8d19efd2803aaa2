"""The rollout's seed drawing on the fake device: the step's generator lives on the training device
(setup.reseed), and every draw from it must land there too, as CUDA refuses a device generator in a CPU op.
The vLLM engines' seed lines run up to the point where they hand the seeds on (vLLM and the server stubbed);
the transformers and lean engines sample on the device in test_device_rollout.py."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from fakedevice import DeviceGenerator

from thinkrl.rollout import seeds
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines.vllm import VLLMEngine
from thinkrl.rollout.engines.vllm_server import VLLMServerEngine
from thinkrl.rollout.sampling import request_seed
from thinkrl.setup import reseed

pytestmark = pytest.mark.device


class Handed(Exception):
    """Raised by a stubbed backend with the seeds an engine handed it."""

    def __init__(self, seeds):
        self.seeds = seeds


def hand(seeds):
    raise Handed(seeds)


def request(generator) -> Request:
    return Request([[5, 6, 7], [8, 9]], 2, Sampling(4, 1.0, 1.0), [1], 0, generator)


def test_the_step_generator_is_on_the_training_device(fakegpu):
    g = reseed(7, 3, fakegpu, rank=1)
    assert isinstance(g, DeviceGenerator) and g.device == fakegpu


def test_request_seed(fakegpu):
    """The lean and reference engines' seed, and a replay of the step draws the same one."""
    first = request_seed(reseed(7, 3, fakegpu))
    assert 0 <= first < 2**62
    assert request_seed(reseed(7, 3, fakegpu)) == first


def test_vllm_engine_seeds(fakegpu, monkeypatch):
    """vLLM itself is stubbed: the seeds reach SamplingParams, one per completion."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    engine = VLLMEngine()
    engine.llm = types.SimpleNamespace(generate=lambda requests, params, use_tqdm: hand([p["seed"] for p in params]))
    monkeypatch.setattr(engine, "_push", lambda model: None)
    with pytest.raises(Handed) as handed:
        engine.generate(None, request(reseed(7, 3, fakegpu)))
    assert len(handed.value.seeds) == 4 and all(0 <= s < 2**31 - 1 for s in handed.value.seeds)


def test_vllm_server_engine_seeds(fakegpu, monkeypatch):
    """The server is stubbed: the seeds reach the request bodies, one per completion."""
    engine = VLLMServerEngine()
    engine.sampler = types.SimpleNamespace(lora=True)
    engine.push = types.SimpleNamespace(push=lambda version, adapters: "policy-v1")
    monkeypatch.setattr(engine, "policy", lambda req: (1, 0, {}))
    monkeypatch.setattr(engine, "_complete", lambda body: hand([body["seed"]]))
    with pytest.raises(Handed) as handed:
        engine.generate(None, request(reseed(7, 3, fakegpu)))
    assert 0 <= handed.value.seeds[0] < 2**31 - 1


@pytest.mark.parametrize("prefix", ["fraction", "tokens"])
def test_thinking_seeds_prefix_lengths(fakegpu, prefix):
    """Thinking Seeds cut a historical completion at a random length drawn from the step's generator."""
    cfg = types.SimpleNamespace(prefix=prefix, frac_min=0.25, frac_max=0.75, tokens_min=1, tokens_max=3, snap="none")
    lengths = torch.tensor([4, 6])
    mask = torch.arange(6)[None] < lengths[:, None]  # (2, 6)
    hist = Completions(torch.where(mask, 9, 0), torch.zeros(2, 6), mask, lengths, torch.zeros(2, dtype=torch.bool))
    hist = Completions(*(t.to(fakegpu) for t in (hist.tokens, hist.behav_logp, hist.mask, hist.lengths, hist.truncated)))
    cut = seeds._prefix_lengths(hist, cfg, 8, reseed(7, 3, fakegpu), None)
    assert all(1 <= n <= 5 for n in cut), cut
