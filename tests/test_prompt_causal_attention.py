"""The completion pass's maskless causal attention (thinkrl/accel/causal_attention.py) gives the masked pass's values
and gradients, is used only where it applies, and leaves the model on "sdpa" after the update phase."""

import pytest
import torch
import torch.nn.functional as F

from thinkrl.accel import causal_attention as attention
from thinkrl.accel import kept_outputs
from thinkrl.learner.logprobs import token_logprobs

pytestmark = pytest.mark.usefixtures("accel_on")  # tests of the CPU speed-ups themselves


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every SDPA call: (is_causal, got a mask, queries, keys). The prompt pass (keys = queries) is not the
    completion pass (keys = prompt + completion)."""
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, is_causal=False, **kwargs):
        calls.append((is_causal, attn_mask is not None, q.shape[2], k.shape[2]))
        return real(q, k, v, attn_mask, *args, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _completion_causal(calls):
    return [c for c in calls if c[0] and c[3] > 5]  # maskless calls whose keys are more than the 5-token prompt


def _pass(model, prompts, completions, mask, checkpoint=False):
    model.zero_grad()
    out = token_logprobs(model, prompts, completions, mask, pad_id=0, temperature=0.7, entropy=True, checkpoint=checkpoint)
    (out.logp * torch.linspace(-1, 1, completions.shape[1])).sum().backward()
    return out.logp.detach(), out.entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _completions(lengths, T):
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    return torch.where(mask, torch.randint(7, 100, (len(lengths), T), generator=torch.Generator().manual_seed(1)), 0), mask


@pytest.mark.parametrize("checkpoint", [False, True])  # a checkpointed layer's replay must attend the same way
def test_unpadded_prompts_take_the_causal_form_with_the_masked_values_and_gradients(tiny_model_dir, sdpa_calls, monkeypatch, checkpoint):
    from tiny import tiny_lora_model

    monkeypatch.setattr(attention, "MIN_COMPLETION", 4)
    model = tiny_lora_model(tiny_model_dir)
    prompts = [[4, 65, 24, 17, 36], [4, 65, 24, 17, 36], [4, 70, 71, 72, 5]]  # two distinct prompts, one length
    completions, mask = _completions([6, 3, 5], 6)
    plain = _pass(model, prompts, completions, mask, checkpoint)
    assert not _completion_causal(sdpa_calls)  # outside the block: transformers' masked SDPA
    sdpa_calls.clear()
    with attention.prompt_causal_attention(model.config) as on:
        assert on and model.config._attn_implementation == attention.NAME
        got = _pass(model, prompts, completions, mask, checkpoint)
    assert model.config._attn_implementation == "sdpa"
    layers = model.config.num_hidden_layers
    causal = _completion_causal(sdpa_calls)
    # each layer's completion pass: maskless, 5 + 6 queries; a checkpointed layer calls the kernel itself (next test)
    assert causal == ([] if checkpoint else [(True, False, 11, 11)] * layers)
    torch.testing.assert_close(got[0], plain[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], plain[1], rtol=1e-5, atol=1e-6)
    assert got[2].keys() == plain[2].keys()
    for name in plain[2]:
        torch.testing.assert_close(got[2][name], plain[2][name], rtol=1e-4, atol=1e-6)


def test_a_checkpointed_layer_keeps_its_attention_output_for_the_replay(tiny_model_dir, monkeypatch):
    """The replay reuses the forward's attention output instead of running the kernel again, with the values and
    gradients of an unchanged replay and of no checkpointing, to the bit."""
    import contextlib

    from tiny import tiny_lora_model

    monkeypatch.setattr(attention, "MIN_COMPLETION", 4)
    model = tiny_lora_model(tiny_model_dir)
    prompts = [[4, 65, 24, 17, 36], [4, 65, 24, 17, 36], [4, 70, 71, 72, 5]]
    completions, mask = _completions([6, 3, 5], 6)

    def run(checkpoint):
        with attention.prompt_causal_attention(model.config), torch.profiler.profile() as prof:
            got = _pass(model, prompts, completions, mask, checkpoint)
        runs = {e.key: e.count for e in prof.key_averages()}.get("aten::_scaled_dot_product_flash_attention_for_cpu", 0)
        return runs, got

    layers = model.config.num_hidden_layers
    plain_runs, plain = run(False)
    kept_runs, kept = run(True)
    monkeypatch.setattr(kept_outputs, "kept_in_recompute", lambda *_: (contextlib.nullcontext(), contextlib.nullcontext()))
    replayed_runs, replayed = run(True)  # the replay recomputes the attention like every other operation
    assert (plain_runs, kept_runs, replayed_runs) == (2 * layers, 2 * layers, 3 * layers)  # prompt, completion (, replay)
    for got in (kept, replayed):
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
        assert got[2].keys() == plain[2].keys() and all(torch.equal(got[2][n], plain[2][n]) for n in plain[2])


def test_padded_prompts_and_short_completions_keep_the_mask(tiny_model_dir, sdpa_calls, monkeypatch):
    from tiny import tiny_lora_model

    model = tiny_lora_model(tiny_model_dir)
    completions, mask = _completions([6, 3], 6)
    cases = [
        ([[4, 65, 24, 17, 36], [4, 70, 5]], 4),  # prompts of two lengths: left padding needs the mask
        ([[4, 65, 24, 17, 36], [4, 70, 71, 72, 5]], 7),  # completions shorter than MIN_COMPLETION
    ]
    for prompts, minimum in cases:
        monkeypatch.setattr(attention, "MIN_COMPLETION", minimum)
        plain = _pass(model, prompts, completions, mask)
        sdpa_calls.clear()
        with attention.prompt_causal_attention(model.config):
            got = _pass(model, prompts, completions, mask)
        assert [c for c in sdpa_calls if c[3] > 5] and not _completion_causal(sdpa_calls)
        assert all(torch.equal(a, b) for a, b in zip(got[:2], plain[:2]))  # the very same computation
        assert all(torch.equal(got[2][n], plain[2][n]) for n in plain[2])


def test_the_block_restores_sdpa_on_an_error_and_skips_models_it_does_not_cover():
    from transformers import LlamaConfig, Qwen2Config

    config = LlamaConfig()
    config._attn_implementation = "sdpa"
    with pytest.raises(RuntimeError), attention.prompt_causal_attention(config):
        raise RuntimeError("the update failed")
    assert config._attn_implementation == "sdpa"
    eager = LlamaConfig()
    eager._attn_implementation = "eager"
    windowed = Qwen2Config(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    windowed._attn_implementation = "sdpa"
    for other in (eager, windowed):
        before = other._attn_implementation
        with attention.prompt_causal_attention(other) as on:
            assert not on and other._attn_implementation == before
        assert attention.marks(other, False, 10**6) == {}
