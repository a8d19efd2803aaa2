"""Models an engine would sample wrongly are refused before any sampling (thinkrl/rollout/engines/hf.py,
DROPPED_FEATURES): transformers' paged attention ignores Gemma-2's attention logit soft-capping, so its samples
come from another distribution than the trainer scores. rollout.engine=transformers and `thinkrl eval --engine
transformers` refuse such a model; auto, where it would pick transformers, picks lean; without soft-capping the
model is sampled as before."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.config import LoraConfig
from thinkrl.errors import UserError
from thinkrl.forward import visit_distributions
from thinkrl.models import add_lora
from thinkrl.rollout import engines
from thinkrl.rollout.completions import Request, Sampling
from thinkrl.rollout.engines import LeanEngine, describe_path, make_engine
from thinkrl.rollout.engines.hf import TransformersEngine, dropped_features
from thinkrl.rollout.sampling import processed_logp

CPU = torch.device("cpu")


def tiny_gemma2(softcap: float | None, qk_scale: float = 1.0):
    """A 2-layer random Gemma2ForCausalLM over the tiny tokenizer; qk_scale > 1 makes attention logits large
    enough for a cap to matter."""
    from tiny import build_tokenizer
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tok = build_tokenizer()
    config = Gemma2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        query_pre_attn_scalar=32,
        max_position_embeddings=256,
        sliding_window=128,
        attn_logit_softcapping=softcap,
        final_logit_softcapping=None,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(qk_scale)
    return model.eval().requires_grad_(False), tok


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    model, tok = tiny_gemma2(50.0)  # Gemma-2's own cap
    directory = tmp_path_factory.mktemp("tiny-gemma2")
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def gap(engine, model) -> float:
    """Mean |trainer log-prob - behaviour log-prob| of the engine's samples (float32: rounding is ~1e-7)."""
    prompts, sampling, G = [[10, 11, 12, 13, 14], [15, 16, 17]], Sampling(16, 1.0), 3
    comp = engine.generate(model, Request(prompts, G, sampling, [1], 0, torch.Generator().manual_seed(0)))
    trainer = torch.zeros(comp.tokens.shape)
    where = comp.mask.nonzero(as_tuple=True)

    def visit(logits, start):
        dist = processed_logp(logits, sampling)
        at = (where[0][start : start + len(dist)], where[1][start : start + len(dist)])
        trainer[at] = dist.gather(-1, comp.tokens[at][:, None]).squeeze(-1)

    visit_distributions(model, [p for p in prompts for _ in range(G)], comp.tokens, comp.mask, 0, 1.0, visit, raw=True)
    return (trainer - comp.behav_logp).abs()[comp.mask].mean().item()


@pytest.mark.plain
def test_the_paged_path_drops_soft_capping_and_the_reference_loop_keeps_it():
    """The claim the refusal rests on (transformers 5.25). Should this fail because the gap closed, transformers'
    paged attention has learnt soft-capping: drop the row from hf.DROPPED_FEATURES."""
    capped, _ = tiny_gemma2(50.0, qk_scale=30.0)
    assert gap(TransformersEngine(8), capped) > 1e-3
    assert gap(LeanEngine(8), capped) < 1e-4  # the reference loop or lean's fused decoder: either applies the cap
    uncapped, _ = tiny_gemma2(None, qk_scale=30.0)
    assert gap(TransformersEngine(8), uncapped) < 1e-5


def test_transformers_refuses_a_soft_capped_model_and_takes_one_without():
    capped, _ = tiny_gemma2(50.0)
    assert dropped_features(capped) == ["attention logit soft-capping (attn_logit_softcapping=50.0)"]
    with pytest.raises(UserError) as e:
        make_engine("transformers", CPU, 8, 16, model=capped)
    said = str(e.value)
    assert "rollout.engine=transformers cannot sample Gemma2ForCausalLM" in said and "attn_logit_softcapping=50.0" in said
    assert "rollout.engine=lean or rollout.engine=vllm" in said
    with pytest.raises(UserError, match="--engine lean or --engine vllm"):
        make_engine("transformers", CPU, 8, 16, "--engine", capped)
    uncapped, _ = tiny_gemma2(None)
    assert dropped_features(uncapped) == []
    assert isinstance(make_engine("transformers", CPU, 8, 16, model=uncapped), TransformersEngine)
    assert isinstance(make_engine("lean", CPU, 8, 16, model=capped), LeanEngine)
    adapted = add_lora(capped, LoraConfig(rank=2))  # thinkrl eval --adapter: the architecture under the peft wrapper
    with pytest.raises(UserError, match="cannot sample Gemma2ForCausalLM"):
        make_engine("transformers", CPU, 8, 16, model=adapted)


def test_auto_picks_lean_where_it_would_pick_transformers(monkeypatch):
    monkeypatch.setattr(engines, "pick", lambda device, budget: "transformers")  # a GPU without vLLM
    capped, _ = tiny_gemma2(50.0)
    engine = make_engine("auto", CPU, 8, 16, model=capped)
    assert isinstance(engine, LeanEngine)
    line = describe_path(engine, capped).line()
    assert "lean, since transformers' paged attention drops attention logit soft-capping" in line, line
    assert "rollout.engine=transformers" not in line  # the reference loop's note points elsewhere
    uncapped, _ = tiny_gemma2(None)
    assert isinstance(make_engine("auto", CPU, 8, 16, model=uncapped), TransformersEngine)


def test_train_and_eval_refuse_before_sampling(gemma_dir, tmp_path):
    out = tmp_path / "run"
    train = ["train", "--model", str(gemma_dir), "--output-dir", str(out), "-o", "rollout.engine=transformers"]
    train += ["-o", "train.steps=1", "-o", "rollout.max_new_tokens=8", "-o", "verifier.workers=1"]
    with pytest.raises(UserError, match="rollout.engine=transformers cannot sample Gemma2ForCausalLM"):
        CliRunner().invoke(app, train, catch_exceptions=False)
    assert not out.exists()  # refused during setup: no run directory
    evaluate = ["eval", "--model", str(gemma_dir), "--engine", "transformers", "--limit", "2", "--output", str(tmp_path / "ev")]
    with pytest.raises(UserError, match="--engine transformers cannot sample Gemma2ForCausalLM.*--engine lean or --engine vllm"):
        CliRunner().invoke(app, evaluate, catch_exceptions=False)
