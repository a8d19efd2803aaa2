"""TokenBatch checks, the chunked log-prob/entropy forward, the token draw, and the merged sampling copy
(the engines' own tests: tests/test_engines.py, tests/test_lean.py)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import thinkrl.forward as batch_mod
from thinkrl.batch import TokenBatch
from thinkrl.learner.logprobs import token_logprobs
from thinkrl.models import left_pad
from thinkrl.rollout.completions import Sampling
from thinkrl.rollout.policy_copy import PolicySampler
from thinkrl.rollout.sampling import draw, uniforms


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


PROMPTS = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 73, 74, 75, 76, 5]]


def test_token_batch_checks_shapes_and_grad():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="mask has shape"):
        TokenBatch(logp=z, old_logp=z, behav_logp=z, advantages=z, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="old_logp must not carry grad"):
        TokenBatch(logp=z, old_logp=z.clone().requires_grad_(), behav_logp=z, advantages=z, mask=torch.ones(2, 3))
    b = TokenBatch(logp=z, old_logp=z, behav_logp=z, advantages=torch.tensor([1.0, 2.0]), mask=torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert b.advantages.shape == (2, 3) and b.num_tokens == 3 and b.num_seqs == 2
    assert b.advantages[0, 2] == 0  # padding zero-filled


def naive_logprobs(model, prompts, completions, temperature):
    """Reference: full logits for the whole sequence, then gather."""
    p_ids, p_attn, _ = left_pad(prompts, 0, "cpu")
    Lp = p_ids.shape[1]
    ids = torch.cat([p_ids, completions], 1)  # [left-padded prompt | completion] per row
    attn = torch.cat([p_attn, torch.ones_like(completions)], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float() / temperature
    T = completions.shape[1]
    logp_all = torch.log_softmax(logits[:, Lp - 1 : Lp - 1 + T], -1)
    logp = logp_all.gather(-1, completions[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


@pytest.mark.parametrize("chunk_elems", [2**25, 7 * 105])  # one chunk, and chunks of 7 rows (checkpointed)
@pytest.mark.parametrize("rows", [[0, 1], [0, 0, 1, 1, 0]])  # distinct prompts, and prompts shared by several rows
@pytest.mark.parametrize("frozen_head", [False, True])  # a head that trains, and a frozen one (LoRA: h's gradient only)
def test_chunked_logprobs_and_entropy_match_full_logits(tiny, monkeypatch, chunk_elems, rows, frozen_head):
    model, _ = tiny
    monkeypatch.setattr(batch_mod, "CHUNK_ELEMS", chunk_elems)
    head = model.get_output_embeddings().weight
    monkeypatch.setattr(head, "requires_grad", not frozen_head)
    prompts = [PROMPTS[r] for r in rows]
    g = torch.Generator().manual_seed(len(rows))
    lengths = torch.tensor([4, 6, 2, 5, 6][: len(rows)])
    mask = torch.arange(6)[None, :] < lengths[:, None]  # (B, 6)
    completions = torch.where(mask, torch.randint(7, 100, (len(rows), 6), generator=g), 0)
    logp, ent, _ = token_logprobs(model, prompts, completions, mask, pad_id=0, temperature=0.7, entropy=True)
    ref_logp, ref_ent = naive_logprobs(model, prompts, completions, 0.7)
    assert torch.allclose(logp[mask], ref_logp[mask], atol=1e-5)
    assert torch.allclose(ent[mask], ref_ent[mask], atol=1e-5)
    assert (logp[~mask] == 0).all()
    w = torch.rand(int(mask.sum()), generator=g) - 0.3  # a different dL/dlog pi per token, some negative
    (logp[mask] * w).sum().backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (ref_logp[mask] * w).sum().backward()
    assert (head.grad is None) == frozen_head
    for g, p in zip(grads, model.parameters()):
        assert (g is None) == (p.grad is None)
        assert g is None or torch.allclose(g, p.grad, atol=1e-5)
    model.zero_grad()


@pytest.mark.plain
def test_gradient_checkpointing_changes_memory_not_values(tiny_model_dir):
    """Checkpointing replays each decoder layer of the completion pass on the same inputs (the shared prompt
    cache is read, never appended to), so log-probs and gradients are the same to the bit, and a second
    backward-producing pass on the same model is unaffected by the first (the layers are restored)."""
    from tiny import tiny_lora_model

    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]
    mask = torch.arange(5)[None, :] < torch.tensor([5, 3, 4])[:, None]  # (3, 5)
    completions = torch.where(mask, torch.randint(7, 100, (3, 5), generator=torch.Generator().manual_seed(0)), 0)
    model = tiny_lora_model(tiny_model_dir)
    model.train()
    layers = model.get_base_model().model.layers
    calls = []
    layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    results = []
    for checkpointing in (False, True, False):
        model.zero_grad()
        calls.clear()
        logp = token_logprobs(model, prompts, completions, mask, pad_id=0, temperature=0.8, checkpoint=checkpointing).logp
        logp[mask].sum().backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
        assert len(calls) == (3 if checkpointing else 2)  # prompt pass, completion pass (and its replay)
        assert all("forward" not in layer.__dict__ for layer in layers)  # the class's forward again
    (a, grads_a), (b, grads_b), (c, grads_c) = results
    assert torch.equal(b, a) and torch.equal(c, a)
    for name, g in grads_a.items():
        assert g.abs().max() > 0, name
        assert torch.equal(grads_b[name], g), name
        assert torch.equal(grads_c[name], g), name


def test_top_p_and_top_k_only_sample_inside_the_kept_set():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    ids, lp, _ = draw(logits, Sampling(1, 1.0, top_p=0.7), torch.rand(2000, generator=g))
    assert set(ids.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7
    assert torch.allclose(lp[ids == 0], torch.log(torch.tensor(0.5 / 0.8)))  # renormalised on the nucleus
    ids, _, _ = draw(logits, Sampling(1, 1.0, top_k=3), torch.rand(2000, generator=g))
    assert set(ids.tolist()) == {0, 1, 2}
    ids, _, _ = draw(logits, Sampling(1, 1.0), uniforms(7, torch.arange(2000), torch.zeros(2000, dtype=torch.long)))
    freq = torch.bincount(ids, minlength=4).float() / len(ids)
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.04)


def test_merged_sampler_matches_the_lora_policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from thinkrl.config import LoraConfig
    from thinkrl.models import add_lora

    torch.manual_seed(0)
    policy = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(rank=4, alpha=8))
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)  # a non-trivial adapter
    sampler = PolicySampler(policy)
    ids = torch.tensor([PROMPTS[1]])
    model = sampler.refresh()
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)
        for name, p in policy.named_parameters():
            if "lora_A" in name:
                p.data.add_(0.3)  # the policy moves; refresh must follow
        assert not torch.allclose(model(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-3)
        assert torch.allclose(sampler.refresh()(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)


def test_shared_prompt_gradients_are_bitwise_reproducible():
    """Rows sharing a prompt must not use advanced-indexing backward (thread-order accumulation on CPU):
    the same batch has to give the same gradient bits every time, or resume and reruns drift."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4
    )
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 64, (120,), generator=g).tolist()] * 16
    completions = torch.randint(3, 64, (16, 12), generator=g)
    mask = torch.ones(16, 12, dtype=torch.bool)

    def grad():
        model.zero_grad()
        logp = token_logprobs(model, prompts, completions, mask, pad_id=0, temperature=1.0).logp
        (logp * torch.linspace(-1, 1, 16)[:, None]).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    first = grad()
    assert all(torch.equal(first, grad()) for _ in range(5))
