"""What to say about an unknown config key: the thinkrl key for a name TRL or verl users type, else the
closest thinkrl key."""

from __future__ import annotations

from thinkrl.config.typecheck import closest

# the last part of a TRL (GRPOConfig) or verl key -> what it is in thinkrl
FOREIGN = {
    "num_generations": "rollout.group_size",
    "n": "rollout.group_size",
    "learning_rate": "train.lr",
    "entropy_coeff": "train.entropy_coef",
    "max_completion_length": "rollout.max_new_tokens",
    "response_length": "rollout.max_new_tokens",
    "max_prompt_length": "data.max_prompt_tokens",
    "prompt_length": "data.max_prompt_tokens",
    "per_device_train_batch_size": "train.micro_batch_size (sequences per forward/backward; completions per step are "
    "rollout.prompts_per_step x rollout.group_size)",
    "ppo_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "nothing to set: each mini-batch is accumulated over micro-batches "
    "(train.micro_batch_size / train.micro_batch_tokens); train.mini_batches sets optimizer steps per rollout",
    "ppo_mini_batch_size": "train.mini_batches (how many mini-batches each rollout is cut into)",
    "steps_per_generation": "train.mini_batches",
    "num_iterations": "train.epochs",
    "ppo_epochs": "train.epochs",
    "train_batch_size": "rollout.prompts_per_step",
    "max_steps": "train.steps",
    "total_training_steps": "train.steps",
    "beta": "method.beta (grpo / dr_grpo: the coefficient of the k3 KL to the reference)",
    "kl_loss_coef": "method.beta",
    "epsilon": "method.clip_low",
    "epsilon_low": "method.clip_low",
    "epsilon_high": "method.clip_high",
    "clip_ratio_low": "method.clip_low",
    "clip_ratio_high": "method.clip_high",
    "clip_ratio_c": "method.dual_clip",
    "delta": "method.dual_clip (TRL's delta caps the ratio of negative advantages)",
    "loss_type": "the method itself: --method grpo | dr_grpo | dapo | gspo | cispo | ... (thinkrl methods)",
    "loss_agg_mode": "method.aggregation",
    "importance_sampling_level": "--method gspo (sequence-level ratios)",
    "scale_rewards": "advantage.estimator (no_std = no division by the group std)",
    "norm_adv_by_std_in_grpo": "advantage.estimator (no_std = no division by the group std)",
    "max_grad_norm": "train.grad_clip",
    "grad_clip": "train.grad_clip",
    "lr_scheduler_type": "train.schedule",
    "warmup_ratio": "train.warmup_steps (a count of optimizer steps)",
    "use_vllm": "rollout.engine=vllm",
    "vllm_gpu_memory_utilization": "rollout.vllm.memory",
    "gpu_memory_utilization": "rollout.vllm.memory",
    "mask_truncated_completions": "rollout.mask_truncated",
    "reward_funcs": "reward.functions",
    "reward_weights": "reward.functions (each entry has a weight)",
    "seed": "train.seed",
    "model_name_or_path": "model.name (--model)",
    "dataset_name": "data.name (--dataset)",
    "lora_r": "model.lora.rank",
    "lora_alpha": "model.lora.alpha",
}


def unknown_key_hint(dotted: str, valid: list[str]) -> str:
    """' (TRL's num_generations is rollout.group_size)' or ' (did you mean X?)' or ''."""
    last = dotted.rsplit(".", 1)[-1]
    if last in FOREIGN and dotted not in valid:
        return f" (TRL's / verl's {last} is {FOREIGN[last]} in thinkrl)"
    return closest(dotted, valid)
