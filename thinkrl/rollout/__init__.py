"""Stage 1-2 of a training step: sample completions and score them.

policy_copy.py   the weights rollouts are sampled with (merged LoRA, precision, staleness)
engines/         how tokens are sampled: the decode loops that return Completions
sampling.py      one token per row from the processed distribution, with its log-prob
completions.py   Sampling (the distribution), Request (one engine call) and Completions (what every engine returns)
seeds.py         Thinking Seeds: prefixes written by the model's own historical checkpoints
collect.py       one step's data: prompts -> G completions each -> verifier scores -> rewards
"""
