"""FSDP2 (torch `fully_shard`, through Accelerate's FSDP plugin): what thinkrl does differently when the
weights are sharded over the ranks.

`accelerate launch --config_file configs/accelerate/fsdp.yaml` sets the FSDP_* variables and Accelerate's
`prepare` shards the model: each rank then holds 1/N of every parameter, gradient and AdamW moment. Three
things in thinkrl read whole weights, and each asks here:

- the sampler (rollout/policy_copy.py) decodes with its own full copy, which it rebuilds from the sharded
  policy once per update by gathering one parameter at a time (`full`); every rank gathers in the same order;
- checkpoints hold full tensors, as a single process writes them: every rank takes part in the gather and
  rank 0 writes (`gathered`); resume reads the files on rank 0 only and broadcasts them, the weights before
  sharding (`load_weights`) and the optimizer state after it (`load_optimizer`), so a run resumes at any
  process count;
- the gradient norm, which decides whether an update is skipped as non-finite, is one number over all
  shards (`full`), so every rank skips or applies the same update.

Precision is thinkrl's own (`precision_policy`): the shards hold float32 masters, gathered in the compute dtype,
and gradients reduce-scatter in float32; Accelerate's `mixed_precision` is refused, since it would reduce in bf16.

Accelerate turns its FSDP plugin on for GPUs only; torch's FSDP2 runs on the CPU over gloo too, so on a
CPU `accelerator()` takes the same prepare() path. That is how the tests run it (tests/test_fsdp.py).
"""

from __future__ import annotations

import os

import torch

from thinkrl.errors import UserError


def requested() -> bool:
    """Whether the launcher asked for FSDP (accelerate launch with an FSDP config sets this)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("true", "1")


def accelerator(cpu: bool, dtypes=None, **kwargs):
    """The run's Accelerator; with FSDP requested, FSDP2 on a CPU process group too, with the precision policy of
    `dtypes(device)` -> (compute, master) (models.run_dtypes)."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("true", "1"):
        raise UserError(
            "thinkrl does not run under DeepSpeed: its engine steps the optimizer inside backward, past thinkrl's check "
            "for a non-finite update, and keeps its own checkpoint format; shard with FSDP2 instead: "
            "accelerate launch --config_file configs/accelerate/fsdp.yaml (docs/distributed.md)"
        )
    if requested() and os.environ.get("FSDP_VERSION", "1") != "2":
        raise UserError(
            f"FSDP version {os.environ.get('FSDP_VERSION', '1')} was asked for; thinkrl runs FSDP2 only: set fsdp_version: 2 "
            "in the accelerate config (configs/accelerate/fsdp.yaml has it)"
        )
    check_mixed_precision()
    if requested():  # thinkrl/accel's CPU speed-ups repack whole weights, which FSDP holds in shards
        os.environ["THINKRL_ACCEL"] = "0"
    acc = Accelerator(cpu=cpu, **kwargs)
    if requested() and acc.state.distributed_type == DistributedType.MULTI_CPU:
        acc.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables the launcher set
        # in both shared states, as Accelerate does for an accelerator: every AcceleratorState() (prepare() makes
        # some) copies PartialState's over its own, and a later prepare() would wrap the model in DDP instead
        acc.state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if requested() and dtypes is not None:
        acc.state.fsdp_plugin.mixed_precision_policy = precision_policy(*dtypes(acc.device))
    return acc


def check_mixed_precision() -> None:
    """thinkrl sets precision from its own config (model.dtype, model.master_dtype); Accelerate's
    mixed_precision would add a second autocast and, under FSDP2, reduce gradients in bfloat16."""
    setting = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if setting != "no":
        raise UserError(
            f"the accelerate config sets mixed_precision: {setting}; thinkrl sets precision itself (model.dtype computes, "
            'model.master_dtype holds the trained weights): set mixed_precision: "no" there and e.g. -o model.dtype=bfloat16'
        )


def precision_policy(compute: torch.dtype, master: torch.dtype):
    """FSDP2's MixedPrecisionPolicy for the run: the shards hold the masters (model.master_dtype), each unit's
    forward and backward run on weights gathered in the compute dtype (model.dtype), and gradients are
    reduce-scattered in the masters' dtype, so float32 masters are also summed over ranks in float32 (verl's
    FSDP actor does the same). Compute and masters alike: no casts, as without a policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if compute == master:
        return MixedPrecisionPolicy()
    # LoRA too: its frozen base (compute dtype) and float32 adapters are gathered in one dtype
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=master)


def is_sharded(model) -> bool:
    """Whether `model` (or the module it wraps) is under fully_shard."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules())


def shard_frozen(root, like, accelerator):
    """A frozen module (a full fine-tune's reference) sharded as the policy `like` is: one unit per decoder layer
    (root._no_split_modules, the classes Accelerate wraps) and the root, on like's device mesh with the run's
    mixed precision; a whole copy per device otherwise (15 GB of bfloat16 for a 7B model)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    mesh = next(p for p in like.parameters() if isinstance(p, DTensor)).device_mesh
    plugin = accelerator.state.fsdp_plugin
    mp = getattr(plugin, "mixed_precision_policy", None) or MixedPrecisionPolicy()
    layers = set(getattr(root, "_no_split_modules", None) or ())
    for module in root.modules():
        if type(module).__name__ in layers:
            fully_shard(module, mesh=mesh, mp_policy=mp)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    return root


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor shard is gathered from every rank (a collective), a plain tensor is itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def gathered(root, optimizer, trainable_only: bool) -> tuple[dict, dict]:
    """(weights, optimizer state) as full CPU tensors on rank 0 ({} elsewhere): every rank must call it.
    Weights are named as the policy names them (the root module holds it as `.policy`); with LoRA only the
    trainable ones, which is all a checkpoint keeps of them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    rank = torch.distributed.get_rank()
    policy = root.policy
    weights = {}
    for name, p in policy.named_parameters():  # one parameter at a time: rank 0 never holds two copies
        if p.requires_grad or not trainable_only:
            t = full(p.detach())
            if rank == 0:
                weights[name] = t.cpu().clone()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return weights, get_optimizer_state_dict(root, optimizer, options=options)


def load_optimizer(root, optimizer, state: dict) -> None:
    """Optimizer state written by `gathered`, read on rank 0 only ({} elsewhere), into every rank's shards: rank 0
    broadcasts it one tensor at a time and each rank keeps its shard, so no other rank reads the whole file
    (a 7B full fine-tune's is 61 GB of float32 moments)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(root, optimizer, optim_state_dict=state, options=options)


def load_weights(load, model) -> None:
    """A checkpoint's weights into the whole `model` on every rank, before sharding: rank 0 runs `load`, then sends
    the trainable weights (all a checkpoint changes) to the others one at a time, so they never read the file.
    A checkpoint rank 0 refuses is the same one-line error on every rank."""
    dist = torch.distributed
    failed: Exception | None = None
    if dist.get_rank() == 0:
        try:
            load()
        except Exception as e:  # any failure: the other ranks must not wait for weights that never come
            failed = e
    said = [None if failed is None else str(failed) if isinstance(failed, UserError) else f"rank 0 could not load the checkpoint: {failed}"]
    dist.broadcast_object_list(said, src=0)
    if failed is not None:
        raise failed
    if said[0] is not None:
        raise UserError(said[0])
    for p in model.parameters():
        if p.requires_grad:
            dist.broadcast(p.data, src=0)
