"""Thinking Seeds outside the loss: the checkpoint pool, seeded rollouts, the config switch and resume
(thinkrl/rollout/seeds.py). The loss (docs/methods.md, thinking_seeds) is tests/methods/test_thinking_seeds.py."""

from types import SimpleNamespace

import pytest
import torch
from test_cli_e2e import invoke, tiny_args
from test_supply_and_sampler import PROMPTS, tiny

from thinkrl.config import SeedsConfig
from thinkrl.learner.logprobs import token_logprobs
from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import LeanEngine
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.rollout.seeds import SeedPool, seeded_generate
from thinkrl.run.jsonl import read_jsonl
from thinkrl.settings import load_config, resolve


def test_pool_is_fifo_with_a_pinned_initial_policy(tmp_path):
    pool = SeedPool(SeedsConfig(every=2, pool_size=2, keep_initial=True), tmp_path, on_disk=False)
    w = lambda v: {"a": torch.tensor([float(v)])}  # noqa: E731
    added = [pool.maybe_add(s, w(s)) for s in range(9)]
    assert added == [s % 2 == 0 for s in range(9)]
    assert [e.step for e in pool.entries] == [0, 6, 8] and pool.entries[0].pinned
    assert [e.step for e in pool.older_than(8)] == [0, 6]
    unpinned = SeedPool(SeedsConfig(every=2, pool_size=2, keep_initial=False), tmp_path, on_disk=False)
    for s in range(9):
        unpinned.maybe_add(s, w(s))
    assert [e.step for e in unpinned.entries] == [6, 8]
    assert unpinned.weights(unpinned.entries[0], "cpu")["a"].item() == 6.0


def test_pool_on_disk_survives_eviction_through_checkpoint_links(tmp_path):
    pool = SeedPool(SeedsConfig(every=1, pool_size=1, keep_initial=False), tmp_path / "seeds", on_disk=True)
    pool.maybe_add(0, {"a": torch.tensor([0.0])})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    pool.save(ckpt)
    pool.maybe_add(1, {"a": torch.tensor([1.0])})  # evicts step 0 and deletes its pool file
    assert not (tmp_path / "seeds" / "step-0.pt").exists()
    restored = SeedPool(pool.cfg, tmp_path / "seeds", on_disk=True)
    restored.load(ckpt, "cpu")
    assert [e.step for e in restored.entries] == [0]
    assert restored.weights(restored.entries[0], "cpu")["a"].item() == 0.0


@pytest.mark.plain
def load(policy, state: dict) -> None:
    for n, p in policy.named_parameters():
        if n in state:
            p.copy_(state[n])


@pytest.mark.plain  # the lean engine decodes
def test_seeded_prefixes_come_from_the_historical_adapter(tiny_model_dir):
    policy = tiny(tiny_model_dir)
    sampler = PolicySampler(policy, copy_always=True)
    cfg = SeedsConfig(enabled=True, every=1, per_group=2, prefix="tokens", tokens_min=2, tokens_max=4)
    pool = SeedPool(cfg, "/nonexistent", on_disk=False)
    pool.maybe_add(0, sampler.snapshot())
    history = pool.entries[0].weights
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_A" in n:
                p.add_(0.5)  # the policy moves on: current and historical log-probs now differ
    sampler.refresh()
    tok = SimpleNamespace(decode=lambda ids: "x")
    gen = torch.Generator().manual_seed(0)
    comp = seeded_generate(LeanEngine(), sampler, pool, 1, Request(PROMPTS, 3, Sampling(8, 1.0), [1], 0, gen), tok)
    assert comp.tokens.shape[0] == 6 and comp.prefix_len.tolist()[0] == 0  # row 0 of each group is unseeded
    seeded = (comp.prefix_len > 0).nonzero().squeeze(-1)
    assert len(seeded) > 0 and (comp.seed_step[seeded] == 0).all() and (comp.seed_step[comp.prefix_len == 0] == -1).all()
    prompts = [PROMPTS[i // 3] for i in range(6)]
    with torch.no_grad():
        now = token_logprobs(policy, prompts, comp.tokens, comp.mask, 0, 1.0).logp
        current = sampler.snapshot()
        load(policy, history)
        then = token_logprobs(policy, prompts, comp.tokens, comp.mask, 0, 1.0).logp
        load(policy, current)
    prefix, cont = comp.prefix_mask & comp.mask, comp.mask & ~comp.prefix_mask
    assert torch.allclose(comp.behav_logp[prefix], then[prefix], atol=1e-4)  # written by the historical adapter
    assert not torch.allclose(comp.behav_logp[prefix], now[prefix], atol=1e-2)
    assert torch.allclose(comp.behav_logp[cont], now[cont], atol=1e-4)  # continued by the current policy
    assert (comp.lengths <= 8).all()


def test_method_name_turns_seeding_on_and_any_method_can_seed():
    assert resolve(load_config(None, ["method.name=thinking_seeds"])).seeds.enabled is True
    assert resolve(load_config(None, ["method.name=grpo"])).seeds.enabled is False
    assert resolve(load_config(None, ["method.name=grpo", "seeds.enabled=true"])).seeds.enabled is True
    from thinkrl.errors import UserError

    with pytest.raises(UserError, match="per_group"):
        resolve(load_config(None, ["method.name=thinking_seeds", "seeds.per_group=8"]))


@pytest.mark.parametrize("extra", [(), ("-o", "model.lora.rank=0", "-o", "train.lr=1e-3")], ids=["lora-memory", "full-disk"])
@pytest.mark.plain
def test_seeded_run_resumes_with_its_pool(tiny_model_dir, tmp_path, extra):
    opts = ("--method", "thinking_seeds", "-o", "seeds.every=2", *extra)
    keys = ["reward/mean", "loss", "grad_norm", "seeds/pool_size", "seeds/seeded_frac", "prefix/abs_log_ratio"]
    invoke(tiny_args(tiny_model_dir, tmp_path / "straight", 5, *opts))
    invoke(tiny_args(tiny_model_dir, tmp_path / "split", 3, *opts))
    invoke(["train", "--resume", str(tmp_path / "split"), "-o", "train.steps=5"])
    straight = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "straight" / "metrics.jsonl")]
    split = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "split" / "metrics.jsonl")]
    assert split == straight
    assert [m["seeds/pool_size"] for m in straight] == [1, 1, 2, 2, 3]
    assert straight[0]["seeds/seeded_frac"] == 0 and all(m["seeds/seeded_frac"] > 0 for m in straight[1:])
    rows = read_jsonl(tmp_path / "straight" / "rollouts.jsonl")
    assert any(r["prefix_len"] > 0 and r["seed_step"] >= 0 for r in rows)
