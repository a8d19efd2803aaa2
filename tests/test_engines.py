"""Every engine returns the same thing (thinkrl/rollout/engines/): for the same prompts, behav_logp is the
log-prob of each sampled token under the processed distribution (tempered, top-k / top-p truncated) as the
trainer recomputes it; greedy decoding agrees with the transformers forward; EOS, min_new_tokens, top-p and
top-k are honoured; the sampler's top-K and entropy records match its distribution; Thinking-Seeds prefixes
continue correctly. vllm runs where vLLM imports (make test-vllm), and is skipped elsewhere."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from thinkrl.errors import UserError
from thinkrl.forward import visit_distributions
from thinkrl.learner.logprobs import token_logprobs
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines import make_engine
from thinkrl.rollout.engines.reference import reference_generate
from thinkrl.rollout.sampling import processed_logp

HAS_VLLM = importlib.util.find_spec("vllm") is not None
if os.environ.get("THINKRL_REQUIRE_VLLM") and not HAS_VLLM:  # make test-vllm: a skip there would hide a broken install
    raise RuntimeError("THINKRL_REQUIRE_VLLM is set but vllm does not import")
VLLM = pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed")])
ENGINES = ["lean", "transformers", VLLM]
PROMPTS = [[4, 65, 24, 17, 36], [4, 70, 71, 72, 73, 74, 75, 76, 5], [9, 9, 8]]  # three lengths
EOS = [1, 30, 31]
G = 3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """The tiny random model with heads of 32 (vLLM's CPU attention has no kernel for the usual tiny 8)."""
    from tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-engines"), heads=2, head_dim=32)


@pytest.fixture(scope="module")
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval().requires_grad_(False)


_ENGINES: dict = {}


@pytest.fixture
def engine(request, tiny_dir):
    """One engine of each kind per test session (vLLM takes seconds to start)."""
    name = request.param
    if name not in _ENGINES:
        _ENGINES[name] = make_engine(name, torch.device("cpu"), 8, 64, model_path=str(tiny_dir), max_model_len=128)
    return _ENGINES[name]


def run(engine, model, sampling: Sampling, prompts=PROMPTS, seed: int = 0, **record) -> Completions:
    return engine.generate(model, Request(prompts, G, sampling, EOS, 0, torch.Generator().manual_seed(seed), **record))


@torch.no_grad()
def processed(model, comp: Completions, sampling: Sampling, prompts=PROMPTS) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The trainer-side processed log-prob of every sampled token (B, T), and the processed distributions."""
    rows = [p for p in prompts for _ in range(G)]
    out = torch.zeros(comp.tokens.shape)
    dists: list[torch.Tensor] = []
    where = comp.mask.nonzero(as_tuple=True)

    def visit(logits, start):
        dist = processed_logp(logits, sampling)
        at = (where[0][start : start + len(dist)], where[1][start : start + len(dist)])
        out[at] = dist.gather(-1, comp.tokens[at][:, None]).squeeze(-1)
        dists.append(dist)

    visit_distributions(model, rows, comp.tokens, comp.mask, 0, 1.0, visit, raw=True)
    return out, dists


SAMPLINGS = [Sampling(10, 0.9), Sampling(10, 1.0, top_p=0.8), Sampling(10, 1.2, top_k=5), Sampling(10, 0.0)]


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["tempered", "top_p", "top_k", "greedy"])
@pytest.mark.plain
def test_behav_logp_is_the_processed_distribution(engine, model, sampling):
    comp = run(engine, model, sampling)
    assert comp.tokens.shape[0] == len(PROMPTS) * G and comp.mask.sum(-1).tolist() == comp.lengths.tolist()
    expected, _ = processed(model, comp, sampling)
    assert torch.isfinite(expected[comp.mask]).all()  # every sampled token lies inside the top-k / top-p set
    assert (comp.behav_logp[comp.mask] - expected[comp.mask]).abs().max() < 1e-4
    if sampling.temperature > 0 and sampling.top_p == 1 and not sampling.top_k:
        # untruncated: what the trainer recomputes for pi_old, so mismatch/abs_log_ratio would be ~0
        rows = [p for p in PROMPTS for _ in range(G)]
        logp = token_logprobs(model, rows, comp.tokens, comp.mask, 0, sampling.temperature).logp
        assert (logp - comp.behav_logp)[comp.mask].abs().mean() < 1e-4


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_greedy_agrees_with_the_transformers_forward(engine, model):
    greedy = Sampling(12, 0.0)
    comp = run(engine, model, greedy)
    ref = reference_generate(model, Request(PROMPTS, G, greedy, EOS, 0))
    assert torch.equal(comp.lengths, ref.lengths) and torch.equal(comp.tokens, ref.tokens)


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_eos_ends_rows_and_the_budget_truncates_them(engine, model):
    comp = run(engine, model, Sampling(12, 1.0), seed=5)
    assert comp.lengths.max() <= 12
    for row, n, trunc in zip(comp.tokens, comp.lengths, comp.truncated):
        ended = row[n - 1].item() in EOS
        assert ended != bool(trunc) and (bool(trunc) == (n == 12 and not ended))
        assert (row[n:] == 0).all()  # padding after the end
        assert not any(t in EOS for t in row[: n - 1].tolist())  # nothing past the first end


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_each_completion_ends_at_its_own_budget(engine, model):
    """Per-completion budgets (Thinking-Seeds continuations, eval prompts near the context limit); with no
    end-of-sequence id every completion runs to exactly its budget."""
    budgets = [1, 5, 9, 2, 7, 3, 9, 4, 6]
    comp = engine.generate(model, Request(PROMPTS, G, Sampling(9, 1.0), [], 0, torch.Generator().manual_seed(0), budgets=budgets))
    assert comp.lengths.tolist() == budgets and bool(comp.truncated.all())


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_min_new_tokens_suppresses_an_early_end(engine, model):
    ends = list(range(40, 105))  # most of the vocabulary ends a row
    sampling = Sampling(12, 1.0, min_new_tokens=6)
    if engine.name == "transformers":  # its continuous batching drops the processor: refused, not ignored
        with pytest.raises(UserError, match="min_new_tokens is not supported by rollout.engine=transformers"):
            engine.generate(model, Request(PROMPTS, G, sampling, ends, 0, torch.Generator().manual_seed(0)))
        return
    comp = engine.generate(model, Request(PROMPTS, G, sampling, ends, 0, torch.Generator().manual_seed(0)))
    assert comp.lengths.min() >= 6
    free = engine.generate(model, Request(PROMPTS, G, Sampling(12, 1.0), ends, 0, torch.Generator().manual_seed(0)))
    assert free.lengths.min() < 6  # without it, rows do end early here


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_same_seed_same_completions(engine, model):
    a, b = run(engine, model, Sampling(10, 1.0), seed=7), run(engine, model, Sampling(10, 1.0), seed=7)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.behav_logp, b.behav_logp)


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_records_match_the_sampling_distribution(engine, model):
    sampling = Sampling(8, 1.0, top_p=0.9)
    if engine.name == "vllm":  # vLLM reports no entropy: refused with one line; its top-K is checked below
        with pytest.raises(UserError, match="cannot record the sampler's entropy"):
            run(engine, model, sampling, record_entropy=True)
    entropy = engine.name != "vllm"
    comp = run(engine, model, sampling, record_topk=3, record_entropy=entropy)
    _, dists = processed(model, comp, sampling)
    dist = torch.cat(dists)  # (N, V) row-major over the mask
    top = dist.topk(3, dim=-1)
    assert torch.allclose(comp.topk_logp[comp.mask], top.values.clamp(min=-1e4), atol=1e-4)
    if entropy:
        expected = -torch.where(dist > -torch.inf, dist.exp() * dist, 0.0).sum(-1)
        assert torch.allclose(comp.entropy[comp.mask], expected, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_new_weights_are_what_the_engine_samples_with(engine, tiny_dir):
    """The sampling copy changes after every update (a PolicySampler bumps its version); an engine that holds
    its own copy of the weights (vLLM) must sample with the new ones."""
    from thinkrl.rollout.policy_copy import PolicySampler

    policy = AutoModelForCausalLM.from_pretrained(tiny_dir)
    sampler = PolicySampler(policy, copy_always=True)
    greedy = Sampling(10, 0.0)
    before = run(engine, sampler.refresh(), greedy)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in policy.parameters():  # a different policy: a different greedy path
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    model = sampler.refresh()
    after = run(engine, model, greedy)
    assert not torch.equal(before.tokens, after.tokens)
    assert torch.equal(after.tokens, reference_generate(model, Request(PROMPTS, G, greedy, EOS, 0)).tokens)


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.plain
def test_thinking_seeds_prefixes_continue_under_the_current_policy(engine, tiny_dir, tmp_path):
    """Seeded rows: the prefix comes from the historical policy (its log-probs as behav_logp), the rest from
    the current one, with prefix_len marking the boundary."""
    from transformers import AutoTokenizer

    from thinkrl.config.rollout import SeedsConfig
    from thinkrl.rollout.policy_copy import PolicySampler
    from thinkrl.rollout.seeds import SeedPool, seeded_generate

    policy = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    sampler = PolicySampler(policy, copy_always=True)
    cfg = SeedsConfig(enabled=True, every=1, per_group=2, prefix="tokens", tokens_min=3, tokens_max=4)
    pool = SeedPool(cfg, tmp_path, on_disk=False)
    pool.maybe_add(0, {n: p.detach().clone() for n, p in policy.named_parameters()})
    historical = {n: p.detach().clone() for n, p in policy.named_parameters()}
    with torch.no_grad():
        policy.lm_head.weight.add_(0.3 * torch.randn_like(policy.lm_head.weight))
    sampler.refresh()
    gen = torch.Generator().manual_seed(0)
    comp = seeded_generate(engine, sampler, pool, 1, Request(PROMPTS, 4, Sampling(10, 1.0), EOS, 0, gen), tok)
    rows = [p for p in PROMPTS for _ in range(4)]
    prefix = comp.prefix_mask & comp.mask
    assert prefix.any() and comp.seed_step.eq(0).sum() == 2 * len(PROMPTS)
    current = token_logprobs(sampler.restore(), rows, comp.tokens, comp.mask, 0, 1.0).logp
    then = token_logprobs(sampler.historical(historical), rows, comp.tokens, comp.mask, 0, 1.0).logp
    sampler.restore()
    assert (comp.behav_logp - then)[prefix].abs().max() < 1e-4
    assert (comp.behav_logp - current)[comp.mask & ~prefix].abs().max() < 1e-4


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.plain
def test_train_and_eval_run_with_each_engine(name, tiny_dir, tmp_path):
    """`thinkrl train -o rollout.engine=X` on the tiny model, then `thinkrl eval --engine X` of the run: greedy
    answers of the eval agree with the lean engine's."""
    from test_cli_e2e import invoke, tiny_args

    from thinkrl.run.jsonl import read_jsonl

    for engine in _ENGINES.values():  # a second vLLM engine in this process needs the first one's memory
        engine.close()
    _ENGINES.clear()
    out = tmp_path / "run"
    invoke(tiny_args(tiny_dir, out, 2, "-o", f"rollout.engine={name}"))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert len(metrics) == 2 and all(m["mismatch/abs_log_ratio"] < 1e-4 for m in metrics)
    answers = {}
    for engine in dict.fromkeys([name, "lean"]):
        dest = tmp_path / f"eval-{engine}"
        invoke(["eval", "--model", str(out), "--limit", "6", "--engine", engine, "--output", str(dest)])
        answers[engine] = [(r["id"], r["completion"]) for r in read_jsonl(dest / "samples.jsonl")]
    assert sorted(answers[name]) == sorted(answers["lean"])


def test_library_notes_are_quiet_inside_an_engine_call_and_restored_after(caplog):
    """Per-call library lines (transformers' continuous batching, vLLM's weight reloads) would print at every
    training step; inside `quiet` only errors pass, and each logger's own level comes back afterwards."""
    import logging

    from thinkrl.rollout.engines import quiet

    log = logging.getLogger("ContinuousBatchingLogger")
    log.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO, logger="ContinuousBatchingLogger"):
        with quiet("ContinuousBatchingLogger"):
            log.warning("eos_token_id not set")
            log.error("a real failure")
        log.warning("after")
    assert [r.getMessage() for r in caplog.records] == ["a real failure", "after"]
    assert log.level == logging.INFO
