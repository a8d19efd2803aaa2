"""rollout.engine=vllm with several trainer processes (no vLLM needed): refused in one line, since vLLM's LLM() in
every rank would land on the first GPU, and `auto` picks as if vLLM were not installed."""

from __future__ import annotations

import pytest
import torch

from thinkrl import distributed
from thinkrl.errors import UserError
from thinkrl.rollout.engines import check_engine, make_engine


def test_the_in_process_vllm_engine_is_refused_with_several_processes(monkeypatch):
    monkeypatch.setattr(distributed, "world", lambda: (0, 2))
    with pytest.raises(UserError) as e:
        check_engine("vllm")
    said = str(e.value)
    assert "rollout.engine=vllm samples in one process only, and this run has 2" in said and "\n" not in said
    assert "rollout.engine=lean" in said and "rollout.engine=vllm_server" in said
    monkeypatch.setattr("thinkrl.rollout.engines._vllm_installed", lambda: True)  # auto on a GPU with vLLM: not vllm
    engine = make_engine("auto", torch.device("cuda"), 4, 8)
    assert engine.name == "transformers" and engine.chosen == "auto on a GPU, several processes (vLLM runs in one)"
