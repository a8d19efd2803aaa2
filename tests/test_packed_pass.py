"""The packed completion pass (thinkrl/forward.py): each group's completions back to back in one row, without
the padding after each one's end, give the padded pass's log-probs, entropies and LoRA gradients; it runs where
the model allows it and falls back to the padded pass elsewhere."""

import contextlib

import pytest
import torch
from families import build_family

from thinkrl import forward
from thinkrl.learner.logprobs import token_logprobs

PROMPTS = [[4, 65, 24, 17, 36], [4, 65, 24, 17, 36], [4, 70, 71, 5], [4, 70, 71, 5], [4, 70, 71, 5], [9, 9, 9, 9, 9, 9, 9]]
LENGTHS = [6, 2, 9, 1, 4, 3]  # three groups (two of them sharing a prompt across rows), ragged ends


def _completions(T: int = 9):
    held = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, T)
    mask = held.clone()
    mask[2, 1] = False  # a token the completion holds but did not generate (a Thinking Seeds prefix): kept, not predicted
    ids = torch.randint(7, 90, (len(LENGTHS), T), generator=torch.Generator().manual_seed(3))
    return torch.where(held, ids, 0), mask


def _pass(model, packed: bool):
    model.zero_grad()
    completions, mask = _completions()
    out = token_logprobs(model, PROMPTS, completions, mask, pad_id=0, temperature=0.7, entropy_grad=True, packed=packed)
    weights = torch.linspace(-1, 1, completions.shape[1])
    ((out.logp * weights).sum() + out.entropy.sum() * 0.3).backward()
    return out.logp.detach(), out.entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _rows_of_completion_passes(model, monkeypatch) -> list[tuple[int, int]]:
    """(rows, positions) of every body call: each token_logprobs makes a prompt pass, then a completion pass."""
    body, _, _ = forward.body_and_head(model)
    calls, real = [], body.forward
    monkeypatch.setattr(body, "forward", lambda *a, **k: (calls.append(tuple(k["input_ids"].shape)), real(*a, **k))[1])
    return calls


@pytest.mark.parametrize("accel", [False, True])  # peft's layers, and the update phase's fused LoRA with packed W^T
@pytest.mark.plain
def test_the_packed_pass_gives_the_padded_values_and_gradients(tiny_model_dir, accel, monkeypatch):
    from tiny import tiny_lora_model

    from thinkrl.probe.measure import probe_pass

    model = tiny_lora_model(tiny_model_dir)
    assert forward.packable(model.config)
    calls = _rows_of_completion_passes(model, monkeypatch)
    with probe_pass(model) if accel else contextlib.nullcontext():
        plain = _pass(model, packed=False)
        got = _pass(model, packed=True)
    # prompt pass (3 distinct prompts, left-padded to 7), then the completion pass: 6 rows of 9, or 3 rows of 6 + 2 / 9 + 1 + 4 / 3
    assert calls == [(3, 7), (6, 9), (3, 7), (3, 14)]
    torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], plain[1], rtol=1e-5, atol=1e-6)
    assert got[2].keys() == plain[2].keys() and len(plain[2]) > 0
    for name in plain[2]:
        torch.testing.assert_close(got[2][name], plain[2][name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "gemma3", "phi3"])
def test_packing_runs_only_where_every_layer_attends_fully(family, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_family(family, tmp_path / family))
    calls = _rows_of_completion_passes(model, monkeypatch)
    completions, mask = _completions()
    with torch.no_grad():
        plain = token_logprobs(model, PROMPTS, completions, mask, pad_id=0, temperature=1.0).logp
        got = token_logprobs(model, PROMPTS, completions, mask, pad_id=0, temperature=1.0, packed=True).logp
    packs = family in ("qwen2", "qwen3")  # sliding windows (Mistral, Gemma-3) need their own masks; Phi-3 is not covered
    assert forward.packable(model.config) == packs
    assert calls[-1] == ((3, 14) if packs else (6, 9))
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)
