"""The lean engine's slots and key/value storage (thinkrl/rollout/engines/lean.py, slot_storage.py): slots
refilled as rows finish, live rows compacted into the lowest slots, storage that follows the longest live row,
not the budget, and hands each old block back as it grows or compacts."""

from __future__ import annotations

import pytest
import torch
from test_lean import PROMPTS, frozen
from transformers import AutoModelForCausalLM

from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines.lean import lean_generate
from thinkrl.rollout.engines.lean_decoder import LeanDecoder
from thinkrl.rollout.engines.reference import reference_generate
from thinkrl.rollout.engines.slot_storage import CHUNK, SlotStorage


@pytest.fixture
def llama(tiny_model_dir):
    return frozen(AutoModelForCausalLM.from_pretrained(tiny_model_dir))


@pytest.mark.plain
def test_storage_grows_with_the_longest_live_row_not_the_budget(llama):
    """Budget 8,192 with rows that end early: the key/value capacity stays near prompt + longest row."""
    eos = list(range(40, 105))  # most of the vocabulary ends a row: completions of a few tokens
    comp, stats = lean_generate(llama, Request(PROMPTS, 4, Sampling(8192, 1.0), eos, 0, torch.Generator().manual_seed(1)), slots=4)
    longest = max(len(p) for p in PROMPTS) + int(comp.lengths.max())
    assert comp.lengths.max() < 20 and bool((~comp.truncated).all())
    assert stats["generate/kv_capacity"] <= max(CHUNK, longest + CHUNK)  # never the 8,192-token budget
    assert stats["generate/kv_capacity"] >= longest


@pytest.mark.plain
def test_storage_stops_growing_at_the_longest_prompt_plus_the_budget(llama):
    """No end token, budget 3 x CHUNK = 192: rows grow the capacity 64 -> 128 -> 192, and the next geometric
    step (192 + 96, rounded up to 320) would pass what any row can reach; it stops at longest prompt + 192."""
    comp, stats = lean_generate(llama, Request(PROMPTS, 2, Sampling(3 * CHUNK, 1.0), [], 0, torch.Generator().manual_seed(1)), slots=4)
    assert bool(comp.truncated.all())  # every row ran its whole budget
    assert stats["generate/kv_capacity"] == max(len(p) for p in PROMPTS) + 3 * CHUNK
    ref = reference_generate(llama, Request(PROMPTS, 2, Sampling(3 * CHUNK, 1.0), [], 0, torch.Generator().manual_seed(1)))
    assert torch.equal(comp.tokens, ref.tokens)  # and decoded the same tokens


@pytest.mark.plain
def test_finished_slots_are_refilled_from_the_queue(llama):
    """12 requests through 3 slots: each slot starts a new request when its row ends, so the call takes far
    fewer steps than batches of 3 running to their longest row, and slots stay full while requests wait."""
    eos = list(range(60, 105))
    sampling = Sampling(30, 1.0)
    refill = lean_generate(llama, Request(PROMPTS, 6, sampling, eos, 0, torch.Generator().manual_seed(2)), slots=3)
    whole = lean_generate(llama, Request(PROMPTS, 6, sampling, eos, 0, torch.Generator().manual_seed(2)), slots=0)
    comp, stats = refill
    assert torch.equal(comp.tokens, whole[0].tokens)  # the same samples however they were scheduled
    lengths = comp.lengths.tolist()
    static_steps = sum(max(lengths[i : i + 3]) for i in range(0, 12, 3))  # batches of 3 that wait for their longest
    assert stats["generate/decode_steps"] < static_steps
    assert stats["generate/slot_utilisation"] == 1.0


@pytest.mark.plain
def test_live_rows_move_into_the_lowest_slots_once_the_queue_is_dry(llama):
    """After compaction the decode steps run over fewer slots; the result is unchanged."""
    dec = LeanDecoder.for_model(llama)
    calls: list[int] = []
    step = dec.step

    def counted(tokens, live):
        calls.append(tokens.shape[0])
        return step(tokens, live)

    dec.step = counted
    try:
        eos = list(range(60, 105))
        comp, _ = lean_generate(llama, Request(PROMPTS, 8, Sampling(40, 1.0), eos, 0, torch.Generator().manual_seed(4)), slots=16)
    finally:
        del dec.step
    assert calls[0] == 16 and min(calls) < 16  # later steps ran over the packed live rows only
    ref = reference_generate(llama, Request(PROMPTS, 8, Sampling(40, 1.0), eos, 0, torch.Generator().manual_seed(4)))
    assert torch.equal(comp.tokens, ref.tokens)


@pytest.mark.plain
def test_the_last_long_rows_do_not_grow_storage_for_every_slot(llama):
    """Seven short completions and one of 200 tokens in 8 slots: once the short ones end, the long row is
    packed into storage of its own, so the storage never holds 8 slots x 200 positions."""
    budgets = [4, 4, 4, 4, 4, 4, 4, 200]
    req = Request(PROMPTS[:1], 8, Sampling(200, 1.0), [], 0, torch.Generator().manual_seed(0), budgets=budgets)
    comp, stats = lean_generate(llama, req, slots=8)
    assert comp.lengths.tolist() == budgets
    c = llama.config
    per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4  # fp32 K and V
    every_slot = 8 * stats["generate/kv_capacity"] * per_position
    assert stats["generate/kv_capacity"] >= 200 and stats["generate/kv_mb"] * 2**20 < every_slot / 2


@pytest.mark.plain
def test_the_first_token_comes_from_the_prefill(llama):
    """Every request's first token is drawn from its prompt's prefill logits: 12 tokens per row take 11 decode
    steps, and the tokens and log-probs are still the transformers forward's."""
    sampling = Sampling(12, 1.0)
    comp, stats = lean_generate(llama, Request(PROMPTS, 2, sampling, [], 0, torch.Generator().manual_seed(5)))
    ref = reference_generate(llama, Request(PROMPTS, 2, sampling, [], 0, torch.Generator().manual_seed(5)))
    assert stats["generate/decode_steps"] == 11 and bool((comp.lengths == 12).all())
    assert torch.equal(comp.tokens, ref.tokens)
    torch.testing.assert_close(comp.behav_logp, ref.behav_logp, atol=1e-5, rtol=0)


@pytest.mark.plain
def test_a_request_that_ends_at_its_first_token_frees_its_slot_at_once(llama):
    """Budget 1: every request ends in the prefill, so no decode step runs and all 12 requests are answered."""
    comp, stats = lean_generate(llama, Request(PROMPTS, 4, Sampling(1, 1.0), [], 0, torch.Generator().manual_seed(6)), slots=2)
    assert stats["generate/decode_steps"] == 0 and comp.lengths.tolist() == [1] * 12


def test_the_recorder_keeps_every_step_across_its_growth():
    """The Recorder writes into buffers that grow past 64 tokens; what was written before a growth survives, and
    a vocabulary smaller than K gives K = vocabulary columns."""
    from thinkrl.rollout.engines.recorder import Recorder

    rec = Recorder(2, pad_id=-1, device="cpu", record_topk=3, record_entropy=True)
    dist = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))  # (2, V=2)
    for t in range(70):
        rows = torch.tensor([0, 1]) if t < 50 else torch.tensor([0])  # request 1 stops after 50 tokens
        rec.add(rows, torch.full((len(rows),), t), torch.full((len(rows),), -float(t)), dist[rows])
    comp = rec.completions()
    assert comp.tokens.shape == (2, 70) and comp.lengths.tolist() == [70, 50]
    assert comp.tokens[0].tolist() == list(range(70)) and comp.tokens[1, 50:].eq(-1).all()
    assert comp.behav_logp[0, 69] == -69.0 and comp.topk_ids.shape == (2, 70, 2)
    assert comp.topk_ids[0, 0].tolist() == [1, 0] and torch.allclose(comp.entropy[1, :50], torch.tensor(0.6931), atol=1e-4)


@pytest.mark.plain
def test_grown_storage_hands_each_old_block_back_at_once(llama, monkeypatch):
    """Growing key/value storage empties the CPU block cache after each replaced tensor: storage only grows, so
    no later request would fit a kept old block, which would stay resident to the end of the generation."""
    from thinkrl.accel import allocator

    events, reserve = [], SlotStorage.reserve

    def counted(self, positions):
        before = self.capacity
        reserve(self, positions)
        if self.capacity != before:
            events.append("grow")

    monkeypatch.setattr(SlotStorage, "reserve", counted)
    monkeypatch.setattr(allocator, "release", lambda: events.append("release"))
    _, stats = lean_generate(llama, Request(PROMPTS, 1, Sampling(3 * CHUNK, 1.0), [], 0, torch.Generator().manual_seed(1)), slots=3)
    growths = events.count("grow")
    assert growths >= 2 and stats["generate/kv_capacity"] > CHUNK  # 0 -> CHUNK -> more
    per_growth = ["release"] * 2 * llama.config.num_hidden_layers + ["grow"]  # each key and each value tensor, then done
    assert events[: growths * len(per_growth)] == per_growth * growths
    assert events[growths * len(per_growth) :] == ["release"]  # and once at the end of the call, as before


def test_compaction_keeps_the_live_rows_and_hands_back_each_old_tensor(monkeypatch):
    """compact() moves the live slots' keys and values (up to the longest of them) into the lowest slots of storage
    sized for them alone, and the old tensors go back to the system one at a time, each as soon as it is replaced."""
    from thinkrl.accel import allocator

    store = SlotStorage(layers=3, Hk=2, D=4)
    store.reset(5, torch.zeros(1))
    store.reserve(10)
    for kv in store.keys + store.values:
        kv.copy_(torch.randn_like(kv))
    store.lengths = torch.tensor([9, 3, 0, 7, 2])
    before = [kv.clone() for kv in store.keys + store.values]
    replaced = []  # at each release: how many tensors have the new, compacted size
    monkeypatch.setattr(allocator, "release", lambda: replaced.append(sum(kv.shape[0] == 2 for kv in store.keys + store.values)))
    store.compact(torch.tensor([1, 3]))
    assert replaced == list(range(1, 7))  # one release per replaced tensor, right after it
    assert store.lengths.tolist() == [3, 7] and store.capacity == before[0].shape[2]
    for old, new in zip(before, store.keys + store.values):
        assert new.shape == (2, 2, old.shape[2], 4)
        assert torch.equal(new[:, :, :7], old[[1, 3], :, :7])  # up to the longest live row
        assert new[:, :, 7:].eq(0).all()  # the rest zeros, never stale values
