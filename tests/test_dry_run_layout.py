"""`thinkrl train --dry-run --processes N --sharding none|fsdp2 [--server-devices M] --device cuda`: memory per
device, checked against numbers worked by hand from Qwen2.5's shapes (config.json values from the model cards;
no hub: the directories hold the config and tests/tiny.py's tokenizer, and no weights)."""

import dataclasses
import json
import sys

import pytest
import torch
from test_cli_e2e import invoke
from tiny import build_tokenizer
from transformers import AutoConfig

from thinkrl.cli import run
from thinkrl.config import Config
from thinkrl.errors import UserError
from thinkrl.preview import dry_run, layout, memory

MiB = 2**20
QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1e6}
QWEN7B = {**QWEN, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28}
QWEN7B |= {"num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 131072}
QWEN1_5B = {**QWEN, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12}
QWEN1_5B |= {"num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 131072}

# Qwen2.5-7B by hand. A decoder layer: q (3584, 3584) + bias 3584; k and v (512, 3584) + bias 512 each (4 key/value
# heads x 128); o (3584, 3584); gate and up (18944, 3584); down (3584, 18944); two norms of 3584.
LAYER_7B = (3584 * 3584 + 3584) + 2 * (512 * 3584 + 512) + 3584 * 3584 + 3 * 18944 * 3584 + 2 * 3584
ROOT_7B = 2 * 152064 * 3584 + 3584  # embedding and the untied head (152064, 3584), the final norm: outside the layers
PARAMS_7B = 28 * LAYER_7B + ROOT_7B
# The 1.5B: q (1536, 1536) + bias; k and v (256, 1536) + bias (2 heads x 128); o; gate, up (8960, 1536), down; norms.
LAYER_1_5B = (1536 * 1536 + 1536) + 2 * (256 * 1536 + 256) + 1536 * 1536 + 3 * 8960 * 1536 + 2 * 1536
PARAMS_1_5B = 28 * LAYER_1_5B + 151936 * 1536 + 1536  # the head is the embedding (tied)
# LoRA rank 16 on q, k, v, o, gate, up, down: A (16, in) and B (out, 16), 16 x (in + out) each
LORA_1_5B = 28 * 16 * ((1536 + 1536) + 2 * (1536 + 256) + (1536 + 1536) + 2 * (1536 + 8960) + (8960 + 1536))


def model_dir(path, config: dict):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("qwen") / "Qwen2.5-7B", QWEN7B)


@pytest.fixture(scope="module")
def policy7b(qwen7b):
    """The full fine-tune's meta policy and its shape in bfloat16 (CUDA's dtype), the sampler a copy as under FSDP."""
    cfg, config = Config(), AutoConfig.from_pretrained(qwen7b)
    cfg.model.lora.rank = 0
    policy, sampling = dry_run.meta_models(cfg, config, torch.bfloat16, copy_always=True)
    return policy, dry_run.model_shape(config, policy, sampling)


def mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def printed(output: str, part: str) -> str:
    """The figure a report line gives for `part` (the first report's)."""
    line = next(x for x in output.splitlines() if x.strip().startswith(part + "  "))
    return line.strip()[len(part) :].strip().split("  ")[0]


def test_the_hand_worked_counts_are_qwen_2_5s():
    assert (LAYER_7B, PARAMS_7B) == (233_057_792, 7_615_616_512)  # the model card: 7.61B
    assert (PARAMS_1_5B, LORA_1_5B) == (1_543_714_304, 18_464_768)  # the model card: 1.54B


def test_fsdp2_over_8_ranks_shards_every_parameter_as_worked_by_hand(policy7b):
    policy, shape = policy7b
    assert (shape.params, shape.trainable, shape.copy_params) == (PARAMS_7B, PARAMS_7B, PARAMS_7B)
    s = layout.sharded(policy, 8)
    # every dim 0 (3584, 512, 18944, 152064) divides by 8: no padding, each rank holds an eighth
    assert (s.frozen, s.trainable) == (0, PARAMS_7B // 8) == (0, 951_952_064)
    assert (s.root, s.root_trainable, s.layer, s.layer_trainable) == (ROOT_7B, ROOT_7B, LAYER_7B, LAYER_7B)
    plan = memory.Plan("cuda", 2, 2, 16, 50, 1024, False, False, False, 2, 1, "auto", 10, 3, False)
    got = {p.name: p.bytes for p in layout.trainer_parts(shape, plan, layout.Layout(8, "fsdp2"), s, 0)}
    assert shape.trainable_bytes == 4  # float32 masters, computing in bfloat16
    assert got["weights"] == got["gradients"] == 951_952_064 * 4  # 3,631 MiB
    assert got["AdamW moments"] == 2 * 951_952_064 * 4
    assert got["sampling copy"] == PARAMS_7B * 2  # bfloat16, whole on every rank: 14,526 MiB
    # Gathered in bfloat16: root params 2 B + root grads 2 B each, held throughout; then the larger of two layers'
    # params (running, prefetched) at 2 B + one layer's grads at 2 B and their float32 copy for the reduce-scatter
    # (10 x LAYER), or the root's float32 copy at the end (4 x ROOT, the larger: the embedding and head are big)
    assert 4 * ROOT_7B > 10 * LAYER_7B
    assert got["FSDP2 unsharded"] == 2 * ROOT_7B + 2 * ROOT_7B + 4 * ROOT_7B == 8_719_986_688
    assert got["CUDA context"] == 512 * MiB and got["NCCL buffers"] == 1024 * MiB  # estimates (preview/memory.py)
    assert "DDP buckets" not in got and "trainable snapshots" not in got and "vLLM reserve" not in got


def test_fsdp2_pads_dim_0_to_a_multiple_of_the_ranks(policy7b):
    """Three ranks: 3584 -> 1195 rows each (3585 padded), 512 -> 171, 18944 -> 6315, 152064 -> 50688 (exact)."""
    policy, _ = policy7b
    layer = (1195 * 3584 + 1195) + 2 * (171 * 3584 + 171) + 1195 * 3584 + 2 * 6315 * 3584 + 1195 * 18944 + 2 * 1195
    per_rank = 28 * layer + 2 * 50688 * 3584 + 1195
    assert layout.sharded(policy, 3).trainable == per_rank > PARAMS_7B / 3
    assert layout.shard_elements((3584, 18944), 3) == 1195 * 18944 and layout.shard_elements((), 3) == 1


def test_7b_full_fine_tune_on_8_fsdp2_processes_prints_memory_per_device(qwen7b):
    args = ["train", "--dry-run", "--model", str(qwen7b), "--processes", "8", "--sharding", "fsdp2", "--device", "cuda"]
    out = invoke([*args, "-o", "model.lora.rank=0", "-o", "rollout.prompts_per_step=16", "-o", "rollout.max_new_tokens=1024"]).output
    assert "layout: 8 trainer processes, FSDP2" in out and "2 prompts x 8 per process" in out
    assert "memory estimate per trainer device (x8), GPU memory" in out
    assert printed(out, "weights") == printed(out, "gradients") == mib(951_952_064 * 4) == "3,631 MiB"
    assert printed(out, "AdamW moments") == mib(8 * 951_952_064) == "7,263 MiB"
    assert printed(out, "sampling copy") == mib(2 * PARAMS_7B) == "14,526 MiB"
    assert printed(out, "FSDP2 unsharded") == mib(8 * ROOT_7B) == "8,316 MiB"
    assert printed(out, "CUDA context") == "512 MiB" and printed(out, "NCCL buffers") == "1,024 MiB"
    assert "16 slots" in out  # KV cache: the rank's 2 prompts x 8 completions


def test_ddp_and_a_vllm_server_split_the_7b_as_worked_by_hand(policy7b):
    """DDP: every device holds everything and a bucket copy of the gradients. A vLLM server on 2 devices: half the
    sampling weights each, and 2 of the 4 key/value heads for all 64 slots."""
    _, shape = policy7b
    plan = memory.Plan("cuda", 2, 2, 32, 50, 1024, False, False, False, 2, 1, "auto", 10, 3, False)
    ddp = {p.name: p.bytes for p in layout.trainer_parts(shape, plan, layout.Layout(4, "none", server_devices=2), None, 0)}
    assert ddp["weights"] == ddp["gradients"] == ddp["DDP buckets"] == PARAMS_7B * 4  # float32 masters and their grads
    assert ddp["sampling copy"] == ddp["KV cache"] == 0  # the server holds them
    server = {p.name: p.bytes for p in layout.server_parts(shape, plan, layout.Layout(4, "none", 2), slots=64)}
    assert server["sampling weights"] == PARAMS_7B  # 2 B each, over 2 devices
    assert server["KV cache"] == 64 * (50 + 1024) * 28 * 2 * 2 * 128 * 2


def test_the_1_5b_lora_on_one_gpu_keeps_the_single_process_report(tmp_path):
    model = model_dir(tmp_path / "Qwen2.5-1.5B", QWEN1_5B)
    out = invoke(["train", "--dry-run", "--model", str(model), "--device", "cuda", "-o", "rollout.max_new_tokens=1024"]).output
    assert "layout:" not in out and "memory estimate, GPU memory" in out
    assert printed(out, "weights") == mib(PARAMS_1_5B * 2 + LORA_1_5B * 4) == "3,015 MiB"  # adapters stay float32
    assert printed(out, "sampling copy") == mib(PARAMS_1_5B * 2) == "2,944 MiB"  # the merged copy
    assert printed(out, "grads + AdamW state") == mib(LORA_1_5B * 4 * 4) == "282 MiB"  # grads, 2 moments, adapter copy
    assert printed(out, "CUDA context") == "512 MiB" and "NCCL buffers" not in out  # one process: no collectives


def test_a_colocated_vllm_reserves_its_share_of_the_device_and_gives_it_back_while_it_sleeps(policy7b, monkeypatch):
    """rollout.engine=vllm in the trainer: vLLM's share (rollout.vllm.memory, 0 = 0.3) of an 80 GiB device when the
    plan is made without a GPU; its KV cache is inside that share; with vllm.sleep it is a generation-phase part."""
    _, shape = policy7b
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = Config()
    assert dry_run.vllm_reserve(cfg, torch.device("cuda")) == int(0.3 * 80 * 2**30)  # 24 GiB
    cfg.rollout.vllm.memory = 0.5
    assert dry_run.vllm_reserve(cfg, torch.device("cuda")) == 40 * 2**30
    assert dry_run.vllm_reserve(cfg, torch.device("cpu")) == 0
    plan = memory.Plan("cuda", 2, 2, 16, 50, 1024, False, False, False, 2, 1, "auto", 10, 3, False, 40 * 2**30)
    got = {p.name: p for p in memory.parts(shape, plan, 0)}
    assert (got["vLLM reserve"].bytes, got["vLLM reserve"].phase, got["KV cache"].bytes) == (40 * 2**30, "generation", 0)
    awake = {p.name: p for p in memory.parts(shape, dataclasses.replace(plan, vllm_sleeps=False), 0)}
    assert awake["vLLM reserve"].phase == "held"


def test_layout_flags_are_checked_before_anything_loads():
    with pytest.raises(UserError, match="--processes applies only with --dry-run"):
        layout.from_flags(8, None, None, None, dry_run=False)
    for flags, said in [((0, None, None, None), "--processes 0"), ((2, "zero3", None, None), "--sharding zero3: not a sharding")]:
        with pytest.raises(UserError, match=said):
            layout.from_flags(*flags, dry_run=True)
    with pytest.raises(UserError, match="--server-devices 0"):
        layout.from_flags(2, None, 0, None, dry_run=True)
    with pytest.raises(UserError, match="--device tpu"):
        layout.from_flags(None, None, None, "tpu", dry_run=True)
    assert layout.from_flags(None, None, None, None, dry_run=True).single


def test_a_prompt_count_the_processes_cannot_split_is_one_error_line(qwen7b, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["thinkrl", "train", "--dry-run", "--model", str(qwen7b), "--processes", "3"])
    with pytest.raises(SystemExit) as exit_:
        run()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1].startswith("error: rollout.prompts_per_step=2 must be a multiple of the 3 processes")
    cfg = Config()
    cfg.rollout.engine = "lean"
    with pytest.raises(UserError, match="drop --server-devices"):
        layout.check_config(layout.Layout(2, server_devices=1), cfg)
