"""thinkrl: a single-process GRPO-family trainer for comparing policy-loss methods.

Importing the package is cheap (no torch); the pieces live in their modules:
thinkrl.config, thinkrl.train, thinkrl.methods, thinkrl.batch, thinkrl.verifier, thinkrl.evaluate.
"""

__version__ = "0.1.0"
