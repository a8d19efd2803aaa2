"""A checkpointed layer's replay reuses the outputs of the linear layers its pass keeps (thinkrl/accel/kept_outputs.py):
the same log-probs and gradients to the bit, fewer matmuls in the backward, and the kept shapes chosen by the
activation budget, most recompute FLOPs per byte first."""

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from thinkrl.accel import kept_outputs
from thinkrl.accel.fused_lora import fused_lora_layers, lora_shapes
from thinkrl.accel.packed import can_pack, packed_frozen_linears
from thinkrl.learner import update
from thinkrl.learner.logprobs import activation_bytes, recompute_bytes, token_logprobs

pytestmark = pytest.mark.usefixtures("accel_on")  # tests of the CPU speed-ups themselves

needs_packing = pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="oneDNN cannot pack float32 weights in this torch build")


def _pass(model, checkpoint, keep=frozenset()):
    """One update-phase training pass (packed base, fused LoRA): log-probs, entropy, adapter gradients and
    how many linear products ran."""
    prompts = [[4, 65, 24, 17, 36], [4, 65, 24, 17, 36], [4, 70, 71, 72, 5]]
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 5])[:, None]  # (3, 6)
    completions = torch.where(mask, torch.randint(7, 100, (3, 6), generator=torch.Generator().manual_seed(1)), 0)
    model.zero_grad()
    with packed_frozen_linears(model, 8), fused_lora_layers(model, 8), torch.profiler.profile() as prof:
        out = token_logprobs(model, prompts, completions, mask, 0, 0.7, entropy=True, checkpoint=checkpoint, keep=keep)
        (out.logp * torch.linspace(-1, 1, 6)).sum().backward()
    products = {e.key: e.count for e in prof.key_averages()}.get("mkldnn::_linear_pointwise", 0)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return out.logp.detach(), out.entropy, grads, products


@needs_packing
def test_kept_linear_outputs_give_the_same_values_and_gradients_with_fewer_products(tiny_model_dir):
    from tiny import tiny_lora_model

    model = tiny_lora_model(tiny_model_dir)
    shapes = lora_shapes(model)
    layers = model.config.num_hidden_layers
    assert sum(shapes.values()) == 7 * layers  # q, k, v, o, gate, up, down in every layer
    down = (model.config.intermediate_size, model.config.hidden_size)
    plain = _pass(model, False)
    runs = {keep: _pass(model, True, keep) for keep in (frozenset(), frozenset({down}), frozenset(shapes))}
    for got in runs.values():
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
        assert got[2].keys() == plain[2].keys() and all(torch.equal(got[2][n], plain[2][n]) for n in plain[2])
    # products: the prompt pass, the completion pass, and the replay of what was not kept
    replayed = runs[frozenset()][3]
    assert plain[3] == replayed - 7 * layers
    assert runs[frozenset({down})][3] == replayed - layers
    assert runs[frozenset(shapes)][3] == plain[3]


def test_kept_linears_take_the_most_flops_per_byte_first_while_they_fit():
    # a Llama layer's LoRA linears: down (1536 -> 576), k and v (576 -> 192), q and o (576 -> 576), gate and up
    shapes = Counter({(1536, 576): 1, (576, 192): 2, (576, 576): 2, (576, 1536): 2})
    per = 10  # bytes one output feature takes over the pass
    assert kept_outputs.kept_linears(shapes, per, 0) == frozenset()
    assert kept_outputs.kept_linears(shapes, per, 576 * per) == {(1536, 576)}
    assert kept_outputs.kept_linears(shapes, per, 576 * per + 383 * per) == {(1536, 576)}  # k and v need 384
    assert kept_outputs.kept_linears(shapes, per, 960 * per) == {(1536, 576), (576, 192)}
    # q and o do not fit beside the others, gate and up do not fit at all; what fits further down is still taken
    assert kept_outputs.kept_linears(shapes, per, 575 * per) == {(576, 192)}
    assert kept_outputs.kept_linears(shapes, per, (576 + 384 + 1152 + 3072) * per) == set(shapes)


def test_auto_checkpointing_keeps_what_the_rest_of_the_budget_holds(tiny_model_dir, monkeypatch):
    from tiny import tiny_lora_model

    from thinkrl.config import Config

    model = tiny_lora_model(tiny_model_dir)
    c, tokens = model.config, 100
    ctx = SimpleNamespace(cfg=Config(), policy=model)
    down = (c.intermediate_size, c.hidden_size)
    base, full = recompute_bytes(c, tokens), activation_bytes(c, tokens)
    monkeypatch.setattr(update, "ACTIVATION_BUDGET", full)
    assert update._checkpointing(ctx, tokens) == (False, frozenset())  # fits: no checkpointing
    monkeypatch.setattr(update, "ACTIVATION_BUDGET", base)
    assert update._checkpointing(ctx, tokens) == (True, frozenset())  # room for nothing beside the layer inputs
    down_bytes = c.num_hidden_layers * c.hidden_size * tokens * 4
    monkeypatch.setattr(update, "ACTIVATION_BUDGET", base + down_bytes)
    assert update._checkpointing(ctx, tokens) == (True, frozenset({down}))
    ctx.cfg.train.gradient_checkpointing = True  # asked for: the least memory, nothing kept
    assert update._checkpointing(ctx, tokens) == (True, frozenset())


def test_a_replay_out_of_step_is_an_error_not_a_wrong_value():
    first, second = object(), object()
    store, reuse = kept_outputs.kept_in_recompute()
    with store:
        kept_outputs.result(first, lambda: torch.ones(2))
    with reuse, pytest.raises(RuntimeError, match="out of step"):
        kept_outputs.result(second, lambda: torch.zeros(2))
    assert not kept_outputs.active()
