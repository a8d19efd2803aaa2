"""`thinkrl train --dry-run`: the sampling path and a peak-memory estimate by part, with no weights loaded and no
run directory written; the estimate's parts against numbers worked by hand for the tiny model."""

from dataclasses import replace

import pytest
import torch
from test_cli_e2e import invoke, tiny_args
from transformers import AutoConfig

from thinkrl.config import Config
from thinkrl.preview import dry_run, memory
from thinkrl.rollout.engines.slot_storage import SlotStorage

PARTS = ("process baseline", "weights", "sampling copy", "grads + AdamW state", "KV cache", "activations", "logits chunk", "peak")


@pytest.mark.plain
def test_dry_run_prints_the_path_and_every_part_and_loads_no_weights(tiny_model_dir, tmp_path, monkeypatch):
    import transformers

    def refuse(*_a, **_k):
        raise AssertionError("--dry-run loaded weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    out = tmp_path / "run"
    result = invoke([*tiny_args(tiny_model_dir, out, 2), "--dry-run"])
    assert "sampling: engine lean (auto on a CPU): fused decoder" in result.output
    lines = result.output.splitlines()
    for part in PARTS:
        assert any(line.strip().startswith(part) and "MiB" in line for line in lines), part
    assert "no run directory written" in result.output
    assert not out.exists()


def test_kv_capacity_is_what_the_slot_storage_reaches():
    """The prefill reserves the prompt, each decode step one more position, until the last token is drawn; the
    storage stops at prompt + budget (lean.py's ceiling): 700 + 3000 stops at 3700, not the next step's 3776."""
    for prompt, new in ((1, 1), (53, 64), (51, 1024), (64, 65), (200, 300), (700, 3000), (3, 192)):
        kv = SlotStorage(1, 1, 1)
        kv.reset(1, torch.zeros(1), prompt + new)
        kv.reserve(prompt)
        for end in range(prompt + 1, prompt + new):
            kv.reserve(end)
        assert memory.kv_capacity(prompt, new) == kv.capacity, (prompt, new)
    assert memory.kv_capacity(700, 3000) == 3700 and memory.kv_capacity(53, 64) == 117  # hand-worked: both capped


def _tiny(tiny_model_dir, dtype=torch.float32):
    cfg = Config()  # the defaults: LoRA rank 16, alpha 32 on every linear layer
    config = AutoConfig.from_pretrained(tiny_model_dir)
    policy, sampling = dry_run.meta_models(cfg, config, dtype)
    return dry_run.model_shape(config, policy, sampling)


PLAN = memory.Plan(
    device="cpu",
    dtype_bytes=4,
    copy_bytes=4,
    slots=16,
    prompt_tokens=53,
    max_new_tokens=64,
    lean=True,
    packs=True,
    packs_copy=True,
    rows_per_pass=8,
    prompts_per_pass=1,
    checkpointing="auto",
    steps=1,
    trainable_copies=4,
    reference=False,
)


def test_parts_match_hand_worked_numbers_for_the_tiny_model(tiny_model_dir):
    """tests/tiny.py: vocab 105, hidden 32, MLP 64, 2 layers, 4 query and 2 key/value heads of 8, tied head."""
    shape = _tiny(tiny_model_dir)
    layer_linear = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64  # q, k and v, o, gate up and down: 7,680
    base = 105 * 32 + 2 * (layer_linear + 2 * 32) + 32  # embedding (= head), layers with their norms, final norm
    lora = 2 * 16 * ((32 + 32) + 2 * (32 + 16) + (32 + 32) + 3 * (32 + 64))  # rank 16 on each linear: A (16, in), B (out, 16)
    assert (base, lora) == (21_952, 16_384)
    assert (shape.params, shape.trainable, shape.copy_params) == (base + lora, lora, base)
    assert shape.copy_linear == shape.frozen_linear == 2 * layer_linear + 105 * 32  # the tied head is packed too
    got = {p.name: p.bytes for p in memory.parts(shape, PLAN, baseline=0)}
    assert got["weights"] == (base + lora) * 4 and got["sampling copy"] == base * 4
    assert got["grads + AdamW state"] == lora * 4 * 4  # grads, two moments, the sampler's adapter copy
    # 16 slots x 117 positions (53 prompt + 63 stored: one 64-position chunk, then growth to 128 stopped at the ceiling,
    # prompt + budget = 117) x 2 layers x 2 x Hk 2 x D 8 x 4 B
    assert got["KV cache"] == 16 * 117 * 2 * 2 * 2 * 8 * 4
    per_token = 2 * (10 * 32 + 5 * 64) * 4  # learner/logprobs.py activation_bytes: layers x (10 H + 5 I) x 4 B
    prompt_cache = 8 * 53 * 2 * 2 * 2 * 8 * 4  # the prompt's keys and values, one copy per row of the pass
    assert got["activations"] == 8 * 64 * per_token + 53 * per_token + prompt_cache  # under the budget: not checkpointed
    assert got["logits chunk"] == 2 * 8 * 64 * 105 * 4  # logits and probabilities, float32
    total, phases = memory.peak(memory.parts(shape, PLAN, baseline=0))
    assert total == phases["held"] + max(phases["generation"], phases["update"])


def test_doubling_the_budget_grows_the_kv_part_as_computed(tiny_model_dir):
    shape = _tiny(tiny_model_dir)
    kv = {n: next(p.bytes for p in memory.parts(shape, replace(PLAN, max_new_tokens=n), 0) if p.name == "KV cache") for n in (64, 128)}
    # 53 + 127 = 180 stored positions: capacity 64 -> 128 -> 192, stopped at the ceiling 53 + 128 = 181
    assert kv[128] == 16 * 181 * 2 * 2 * 2 * 8 * 4 and kv[128] / kv[64] == 181 / 117
    exact = replace(PLAN, lean=False)  # other engines: about the live tokens, prompt + budget
    sizes = [next(p.bytes for p in memory.parts(shape, replace(exact, max_new_tokens=n), 0) if p.name == "KV cache") for n in (64, 128)]
    assert sizes == [16 * (53 + n) * 2 * 2 * 2 * 8 * 4 for n in (64, 128)]


@pytest.mark.parametrize("setting", [True, "auto"])
def test_a_checkpointed_pass_keeps_layer_inputs_and_under_auto_what_the_budget_holds(tiny_model_dir, monkeypatch, setting):
    from thinkrl.learner.logprobs import activation_bytes, recompute_bytes

    shape = _tiny(tiny_model_dir)
    monkeypatch.setattr(memory, "ACTIVATION_BUDGET", 0)  # auto: every pass is over the budget, no room to keep
    plan = replace(PLAN, checkpointing=setting)
    got, how = memory.pass_activations(shape, plan)
    assert got == recompute_bytes(shape.config, 8 * 64) < activation_bytes(shape.config, 8 * 64)
    assert "checkpointed" in how and "not" not in how


def test_a_bfloat16_trainer_keeps_its_adapters_in_float32(tiny_model_dir):
    """CUDA's default dtype: peft keeps LoRA adapters in float32 over the bfloat16 base, as a run's startup line says."""
    shape = _tiny(tiny_model_dir, torch.bfloat16)
    got = {
        p.name: p.bytes
        for p in memory.parts(shape, replace(PLAN, device="cuda", dtype_bytes=2, copy_bytes=2, packs=False, packs_copy=False), 0)
    }
    assert shape.trainable_bytes == 4
    assert got["weights"] == 21_952 * 2 + 16_384 * 4 and got["grads + AdamW state"] == 16_384 * 4 * 4
    assert got["sampling copy"] == 21_952 * 2 and "packed frozen weights" not in got
