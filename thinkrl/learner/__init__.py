"""Stage 3-4 of a training step: advantages, then the update of the policy with the method's loss.

advantages.py    rewards (B,) -> group-relative advantages (B,)
logprobs.py      the trainer's forward: per-token log-probs, entropy, top-K (head.py: the output head;
                 attention.py: causal attention over the prompt cache; replay.py: what checkpointing keeps)
old_policy.py    pi_old: the no-grad pass that supplies what a method needs before the first update
batching.py      how an update batch is cut into passes that fit in memory
correction.py    TIS / MIS rollout-mismatch weights and mismatch diagnostics
update.py        TokenBatch per micro-batch -> method.loss -> backward -> optimizer steps
"""
