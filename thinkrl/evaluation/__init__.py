"""`thinkrl eval` and evaluation during training: avg@n, pass@k, maj@n on AIME-style sets.

settings.py   presets and the resolved settings a result is recorded with
evaluate.py   generate, grade and summarise each dataset (resumable output)
metrics.py    the metric definitions
writes.py     a failed write as one line naming the file and the fix
"""
