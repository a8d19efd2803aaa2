"""thinkrl: a GRPO-family trainer for comparing policy-loss methods on one GPU.

Importing the package is cheap (no torch). The folders follow a training step:
rollout/ (sample and score), learner/ (advantages and the update), methods/ (the policy losses, one file
each, over batch.TokenBatch), evaluation/ (thinkrl eval), run/ (the run directory); train.py is the loop,
config/ the settings, data/ the problems, models.py the model, verifier/ the grader, cli.py the commands.
"""

__version__ = "0.1.0"
