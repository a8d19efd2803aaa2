"""What the trainer supplies beyond log-probs (thinkrl/learner/old_policy.py), and the sampler's precision and
staleness (thinkrl/rollout/policy_copy.py), checked against brute-force full-vocabulary computations on the tiny model."""

import pytest
import torch
from test_cli_e2e import invoke, tiny_args

from thinkrl.config import Config
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.logprobs import token_logprobs
from thinkrl.learner.old_policy import old_policy
from thinkrl.ops import js_divergence
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines import LeanEngine
from thinkrl.rollout.policy_copy import PolicySampler, fake_fp4, fake_fp8
from thinkrl.run.jsonl import read_jsonl

PROMPTS = [[7, 8, 9, 10], [11, 12, 13]]


def tiny(tiny_model_dir, lora: bool = True):
    from transformers import AutoModelForCausalLM

    from thinkrl.config import LoraConfig
    from thinkrl.models import add_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if lora:
        model = add_lora(model, LoraConfig(rank=4, alpha=8))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.5)
    return model


def rollout(model, G=3, T=6, **record):
    comp = LeanEngine().generate(model, Request(PROMPTS, G, Sampling(T, 1.0), [1], 0, torch.Generator().manual_seed(0), **record))
    return RolloutBatch([p for p in PROMPTS for _ in range(G)], comp, torch.zeros(len(PROMPTS) * G), G)


def full_logits(model, rb, temperature=1.0):
    """(B, T, V) log-distributions by one plain forward per row: the brute-force reference."""
    B, T = rb.comp.tokens.shape
    out = []
    for i in range(B):
        ids = torch.tensor([rb.prompt_ids[i] + rb.comp.tokens[i].tolist()])
        logits = model(input_ids=ids).logits[0, len(rb.prompt_ids[i]) - 1 : len(rb.prompt_ids[i]) - 1 + T]
        out.append(torch.log_softmax(logits.float() / temperature, -1))
    return torch.stack(out)


class Wants:
    """A stand-in method that requires the given fields."""

    def __init__(self, requires, K=0, reference="batch"):
        self.requires, self.topk_width, self.js_reference = set(requires), K, reference

    def begin_step(self, view):
        return {}


@torch.no_grad()
def test_old_policy_pass_matches_the_full_softmax(tiny_model_dir):
    model = tiny(tiny_model_dir).eval()
    rb = rollout(model)
    ref = full_logits(model, rb)  # (B, T, V)
    mask = rb.comp.mask
    cfg = Config()
    cfg.train.micro_batch_size = 2  # several chunks of rows
    old = old_policy(model, rb, Wants({"old_entropy", "topk_ids", "token_js"}, K=3), cfg, pad_id=0)
    want_logp = ref.gather(-1, rb.comp.tokens[..., None]).squeeze(-1)
    assert torch.allclose(old.logp[mask], want_logp[mask], atol=1e-5)
    assert torch.allclose(old.entropy[mask], -(ref.exp() * ref).sum(-1)[mask], atol=1e-4)
    top = ref.topk(3, dim=-1)
    assert torch.equal(old.topk_ids[mask], top.indices[mask])
    assert torch.allclose(old.topk_logp[mask], top.values[mask], atol=1e-5)
    # token_js against the mean distribution of every valid position of the batch
    p = ref.exp()[mask]  # (N, V)
    assert torch.allclose(old.token_js[mask], js_divergence(p, p.mean(0)), atol=1e-5)
    assert (old.token_js[~mask] == 0).all()
    # and per response
    per = old_policy(model, rb, Wants({"token_js"}, reference="response"), cfg, pad_id=0).token_js
    for i in range(mask.shape[0]):
        pi = ref[i][mask[i]].exp()
        assert torch.allclose(per[i][mask[i]], js_divergence(pi, pi.mean(0)), atol=1e-5)


def test_training_forward_gathers_pi_theta_at_the_proposal_ids(tiny_model_dir):
    model = tiny(tiny_model_dir)
    rb = rollout(model.eval())
    ids = torch.randint(0, 50, (*rb.comp.tokens.shape, 4))
    logp, _, at_ids = token_logprobs(model, rb.prompt_ids, rb.comp.tokens, rb.comp.mask, 0, 1.0, False, ids)
    with torch.no_grad():
        ref = full_logits(model, rb)
    m = rb.comp.mask
    assert torch.allclose(at_ids[m], ref.gather(-1, ids)[m], atol=1e-5)
    at_ids.sum().backward()  # it carries the gradient of pi_theta
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_sampler_records_its_top_k_and_entropy(tiny_model_dir):
    model = tiny(tiny_model_dir).eval()
    comp = rollout(model, record_topk=4, record_entropy=True).comp
    m = comp.mask
    assert comp.topk_ids.shape == (*comp.tokens.shape, 4)
    # when the sampled token is in the recorded top-K, its recorded log-prob is behav_logp
    hit = (comp.topk_ids == comp.tokens[..., None]) & m[..., None]
    assert torch.allclose(comp.topk_logp[hit], comp.behav_logp[..., None].expand_as(hit)[hit])
    assert (comp.entropy[m] > 0).all()
    both = Completions.cat([comp.select(torch.tensor([0, 1])), comp.select(torch.tensor([2]))], pad_id=0)
    assert torch.equal(both.topk_ids[:3, : both.tokens.shape[1]], comp.topk_ids[:3, : both.tokens.shape[1]])


def test_fake_fp8_rounds_each_row_to_its_own_scale():
    w = torch.tensor([[1.0, 0.1234567, -448.0], [1e-3, 2e-3, 3e-3]])
    q = fake_fp8(w)
    assert q[0, 2] == -448.0 and q[0, 0] == 1.0  # representable values stay exactly
    assert q[0, 1] != w[0, 1] and abs(q[0, 1] - w[0, 1]) / w[0, 1] < 0.07  # e4m3: 3 mantissa bits
    assert torch.allclose(q[1], w[1], rtol=0.07) and q[1, 2] == pytest.approx(3e-3)  # the row's own scale


def test_fake_fp4_rounds_to_the_nearest_e2m1_level_of_its_block():
    # blocks of 2 weights. Row 0, block (6, -2.4): absmax 6, scale 1, so the levels are 0, 0.5, 1, 1.5, 2, 3, 4, 6
    # themselves: -2.4 -> -2. Block (0.7, 0.2): scale 0.7 / 6; 0.2 = 1.714 units -> 1.5 units (below the
    # midpoint 1.75) = 0.175.
    # Block (4.9,) is padded with a 0: 4.9 -> 6 units of 4.9 / 6, itself.
    w = torch.tensor([[6.0, -2.4, 0.7, 0.2, 4.9], [0.03, -0.012, 0.0, 0.001, 0.02]])
    q = fake_fp4(w, block=2)
    assert torch.allclose(q[0], torch.tensor([6.0, -2.0, 0.7, 0.175, 4.9]))
    # row 1, block (0.03, -0.012): scale 0.005, -2.4 units -> -2 = -0.01. Block (0, 0.001): 0.001 is its absmax
    # and stays exactly; 0.02 alone does too
    assert torch.allclose(q[1], torch.tensor([0.03, -0.01, 0.0, 0.001, 0.02]))
    # one block for the whole row is the per-row rounding: an outlier (6) takes 0.2 down to 0 with it
    assert fake_fp4(w, block=8)[0].tolist() == [6.0, -2.0, 0.5, 0.0, 4.0]
    # the default block is 16 weights, as NVFP4: a weight 17th in its row gets a scale of its own
    row = torch.cat([torch.full((16,), 6.0), torch.tensor([0.2])])[None]
    assert fake_fp4(row)[0, 16] == pytest.approx(0.2) and fake_fp4(row, block=17)[0, 16] == 0.0


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("precision", ["same", "bf16", "fp16", "fp8", "fp4"])
def test_sampler_precision_changes_the_weights_not_the_policy(tiny_model_dir, precision, lora):
    policy = tiny(tiny_model_dir, lora)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    sampler = PolicySampler(policy, precision)
    model = sampler.refresh()
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        diff = (model(input_ids=ids).logits.float() - policy(input_ids=ids).logits).abs().max().item()
    if precision == "same":
        assert diff < 1e-5
    else:
        assert diff > 1e-5  # a real, measurable mismatch
        assert diff < (3.0 if precision == "fp4" else 0.5)  # but the same model (fp4: 8 magnitudes per block)
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())  # the trainer is untouched
    if precision in ("bf16", "fp16"):
        assert next(model.parameters()).dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def test_staleness_samples_with_the_policy_of_k_steps_ago(tiny_model_dir):
    policy = tiny(tiny_model_dir)
    ids = torch.tensor([PROMPTS[0]])
    sampler = PolicySampler(policy, staleness=2)
    seen, logits = [], []
    with torch.no_grad():
        for _ in range(5):
            seen.append(policy(input_ids=ids).logits.clone())  # the policy at the start of this step
            logits.append(sampler.refresh()(input_ids=ids).logits.clone())
            for n, p in policy.named_parameters():
                if "lora_A" in n:
                    p.add_(0.1)  # an "update"
        for step in range(5):
            assert torch.allclose(logits[step], seen[max(step - 2, 0)], atol=1e-5)
        # the current weights, for evaluation
        assert torch.allclose(sampler.refresh(current=True)(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)
    # the FIFO round-trips through a state dict (checkpoints)
    other = PolicySampler(policy, staleness=2)
    other.load_state_dict(sampler.state_dict())
    assert all(torch.equal(a[n], b[n]) for a, b in zip(sampler.history, other.history) for n in a)


def test_restore_merges_again_only_when_the_adapters_changed(tiny_model_dir, monkeypatch):
    """restore() right after refresh() finds the sampling weights already built from these adapters: no second
    merge, and no new weights version (an engine with its own copy would load them again). A changed adapter
    or historical weights in between make it merge again."""
    policy = tiny(tiny_model_dir)
    sampler, merges = PolicySampler(policy), []
    merge = sampler._rebuild
    monkeypatch.setattr(sampler, "_rebuild", lambda state: (merges.append(1), merge(state))[1])
    ids = torch.tensor([PROMPTS[0]])

    def matches_policy(model) -> bool:
        with torch.no_grad():
            return torch.allclose(model(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)

    sampler.refresh()
    version = sampler.version
    assert matches_policy(sampler.restore()) and len(merges) == 1 and sampler.version == version
    with torch.no_grad():
        next(p for n, p in policy.named_parameters() if "lora_B" in n).add_(0.1)  # an update
    assert not matches_policy(sampler.model)  # still the weights before it
    assert matches_policy(sampler.restore()) and len(merges) == 2 and sampler.version == version + 1
    sampler.historical({n: t + 0.5 for n, t in sampler.snapshot().items()})  # a Thinking Seeds checkpoint
    assert not matches_policy(sampler.model)
    assert matches_policy(sampler.restore()) and len(merges) == 4


@pytest.mark.plain
def test_precision_mismatch_is_logged_end_to_end(tiny_model_dir, tmp_path):
    invoke(tiny_args(tiny_model_dir, tmp_path / "fp8", 2, "-o", "rollout.precision=fp8"))
    invoke(tiny_args(tiny_model_dir, tmp_path / "same", 2))
    fp8 = read_jsonl(tmp_path / "fp8" / "metrics.jsonl")
    same = read_jsonl(tmp_path / "same" / "metrics.jsonl")
    assert all(m["mismatch/abs_log_ratio"] > 1e-4 and m["mismatch/k3"] > 0 for m in fp8)
    assert all(m["mismatch/abs_log_ratio"] < 1e-5 for m in same)


@pytest.mark.plain
def test_staleness_and_sampler_old_policy_resume_exactly(tiny_model_dir, tmp_path):
    opts = ("-o", "rollout.staleness=1", "-o", "train.old_policy=sampler")
    keys = ["reward/mean", "loss", "grad_norm", "mismatch/abs_log_ratio"]
    invoke(tiny_args(tiny_model_dir, tmp_path / "straight", 4, *opts))
    invoke(tiny_args(tiny_model_dir, tmp_path / "split", 2, *opts))
    invoke(["train", "--resume", str(tmp_path / "split"), "-o", "train.steps=4"])
    straight = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "straight" / "metrics.jsonl")]
    split = [{k: m[k] for k in keys} for m in read_jsonl(tmp_path / "split" / "metrics.jsonl")]
    assert split == straight
    # stale samples: from step 2 on the sampler lags the policy, so the mismatch is real
    assert straight[0]["mismatch/abs_log_ratio"] < 1e-5 < straight[1]["mismatch/abs_log_ratio"]


def test_micro_batches_cap_padded_tokens_and_keep_groups_together():
    from thinkrl.learner.old_policy import micro_batches

    lengths = torch.tensor([10, 300, 20, 250, 5, 5, 400, 1])  # two groups of 4
    plain = micro_batches(torch.arange(8), lengths, 8, 4)
    assert [b.tolist() for b in plain] == [[1, 3, 2, 0, 6, 4, 5, 7]]  # group 0 longest first, then group 1
    capped = micro_batches(torch.arange(8), lengths, 8, 4, max_tokens=600)
    assert [b.tolist() for b in capped] == [[1, 3], [2, 0], [6], [4, 5, 7]]  # rows x longest <= 600
    assert sorted(sum((b.tolist() for b in capped), [])) == list(range(8))


def test_an_engine_that_takes_adapters_gets_them_chosen_and_no_merged_copy(tiny_model_dir):
    """vllm_server loads the LoRA adapters itself: the sampler makes no merged copy of the model, and refresh()
    only chooses the adapters, those of rollout.staleness steps ago included."""
    policy = tiny(tiny_model_dir)
    sampler = PolicySampler(policy, staleness=1, adapters_only=True)
    assert sampler.model is policy
    lora_b = next(p for n, p in policy.named_parameters() if "lora_B" in n)
    before = sampler.snapshot()
    sampler.refresh()
    assert all(torch.equal(sampler.adapters[n], t) for n, t in before.items())
    with torch.no_grad():
        lora_b.add_(0.1)  # an update
    sampler.refresh()  # staleness 1: still the adapters before the update
    assert all(torch.equal(sampler.adapters[n], t) for n, t in before.items())
    sampler.refresh(current=True)
    assert torch.equal(sampler.adapters[next(n for n in before if "lora_B" in n)], lora_b.detach())
