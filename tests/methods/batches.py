"""Batch builders and the few other helpers the method tests share; each is defined here and nowhere else.

grad_of               loss, gradient and metrics of one method on one batch
ratio_batch           from token log-ratios over a constant old log-prob
probs_batch           from probabilities pi (policy), mu (sampler) and optionally pi_old
logp_batch            from log-probs given as nested lists (on-policy unless old / behav are given)
random_batch          ragged random batch, off-policy (or on_policy), optionally with entropies
random_lists          ragged random off-policy log-probs as lists, with ratios past the clips (stare, ais)
random_topk_batch     sampled ids and top-K fields from full distributions over 8 ids (sis, ict)
roundtrip             a method state through torch.save / torch.load(weights_only=True)
straight_and_resumed  metrics of a straight tiny run and of one stopped and resumed
"""

import io
import math
from pathlib import Path

import torch

from thinkrl.batch import TokenBatch

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def grad_of(method, logp, batch):
    """method.loss(batch) and its backward: (loss detached, d loss / d logp, metrics)."""
    loss, metrics = method.loss(batch)
    loss.backward()
    return loss.detach(), logp.grad.clone(), metrics


def ratio_batch(log_ratios, adv, mask=None, old=-2.0, dtype=torch.float32):
    """Token log-ratios (B, T) over a constant old log-prob (= behav); logp is a leaf that carries grad."""
    lr = torch.tensor(log_ratios, dtype=dtype)
    logp = (old + lr).requires_grad_()
    mask = torch.ones_like(lr) if mask is None else torch.tensor(mask)
    adv = torch.tensor(adv, dtype=dtype)
    batch = TokenBatch(logp=logp, old_logp=torch.full_like(lr, old), behav_logp=torch.full_like(lr, old), advantages=adv, mask=mask)
    return logp, batch


def probs_batch(pi, mu, adv, mask=None, entropy=None, old=None, dtype=torch.float32):
    """A batch from probabilities: logp = log pi (a leaf with grad), behav_logp = log mu, old_logp = log old or log mu."""
    logp = torch.tensor(pi, dtype=dtype).log().requires_grad_()
    behav = torch.tensor(mu, dtype=dtype).log()
    old_logp = behav.clone() if old is None else torch.tensor(old, dtype=dtype).log()
    mask = torch.ones_like(behav) if mask is None else torch.tensor(mask)
    ent = None if entropy is None else torch.tensor(entropy, dtype=dtype)
    batch = TokenBatch(logp=logp, old_logp=old_logp, behav_logp=behav, advantages=torch.tensor(adv, dtype=dtype), mask=mask, entropy=ent)
    return logp, batch


def logp_batch(logp, adv, mask=None, old=None, behav=None, old_entropy=None, prefix=None):
    """A batch from log-probs (nested lists) whose logp is a fresh leaf with grad; old / behav default to logp
    (on-policy). old_entropy, a number, fills every position; prefix is Thinking Seeds' (B, T) prefix_mask."""
    logp = torch.tensor(logp, dtype=torch.float32)
    leaf = logp.clone().requires_grad_()
    old = logp.clone() if old is None else torch.tensor(old, dtype=torch.float32)
    behav = old.clone() if behav is None else torch.tensor(behav, dtype=torch.float32)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask)
    ent = None if old_entropy is None else torch.full_like(logp, old_entropy)
    batch = TokenBatch(
        logp=leaf,
        old_logp=old,
        behav_logp=behav,
        advantages=torch.tensor(adv, dtype=torch.float32),
        mask=mask,
        old_entropy=ent,
        prefix_mask=None if prefix is None else torch.tensor(prefix),
    )
    return leaf, batch


def random_batch(seed=0, B=4, T=6, on_policy=False, entropy=False):
    """Ragged batch (rows 0 and 2 padded) with pi >= e^-3.05 = 0.047 everywhere. Off-policy by default: pi_old
    and mu both differ from pi. on_policy: logp == old_logp == behav_logp. entropy: an entropy field in [0, 2)."""
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3 - 0.05).requires_grad_()
    old = logp.detach().clone() if on_policy else (logp.detach() + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
    behav = old.clone() if on_policy else (old + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 2:] = False
    ent = torch.rand(B, T, generator=g) * 2 if entropy else None
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])[:B]
    return logp, TokenBatch(logp=logp, old_logp=old, behav_logp=behav, advantages=adv, mask=mask, entropy=ent)


def random_lists(seed=0, B=4, T=6):
    """(logp, adv, mask, old, behav) as lists for logp_batch, so a test can rebuild the batch with changes: off-policy,
    mixed-sign advantages, some ratios past the clips and one r = 12 with A < 0 (past a dual clip of 10)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3 - 0.05
    logp = old + 0.4 * torch.randn(B, T, generator=g)
    logp[1, 0] = old[1, 0] + math.log(12.0)  # r = 12 with A < 0: dual clip at 10
    behav = old + 0.3 * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:] = False
    return logp.tolist(), [1.0, -0.5, 0.7, -1.2], mask.tolist(), old.tolist(), behav.tolist()


TOPK_MASK = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]]).bool()


def random_topk_batch(off_policy: bool, seed: int = 0):
    """(logp, batch, advantages, mask) from full distributions over V = 8 ids, B = 4, T = 6: y ~ pi_old, the
    top-3 of pi_old, pi_theta = pi_old (+ noise when off_policy)."""
    (B, T), V, K = TOPK_MASK.shape, 8, 3
    g = torch.Generator().manual_seed(seed)
    logits_old = torch.randn(B, T, V, generator=g)
    lp_old = torch.log_softmax(logits_old, -1)  # (B, T, V)
    lp_theta = torch.log_softmax(logits_old + torch.randn(B, T, V, generator=g), -1) if off_policy else lp_old
    y = torch.multinomial(lp_old.exp().reshape(-1, V), 1, generator=g).reshape(B, T)
    top = lp_old.topk(K, -1)
    logp = lp_theta.gather(-1, y[..., None]).squeeze(-1).clone().requires_grad_()
    old = lp_old.gather(-1, y[..., None]).squeeze(-1)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])[:, None].expand(B, T)
    batch = TokenBatch(
        logp=logp,
        old_logp=old,
        behav_logp=old,
        advantages=adv,
        mask=TOPK_MASK,
        token_ids=y,
        topk_ids=top.indices,
        topk_old_logp=top.values,
        topk_logp=lp_theta.gather(-1, top.indices),
        generator=torch.Generator().manual_seed(seed),
    )
    return logp, batch, batch.advantages, TOPK_MASK


def roundtrip(state):
    """What checkpoint.py does with a method's state: torch.save, then torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def straight_and_resumed(model_dir, tmp_path, *extra, steps=4, stop_at=2):
    """Train the tiny model `steps` steps straight, and `stop_at` steps then --resume to `steps`: both metrics.jsonl."""
    from test_cli_e2e import invoke, tiny_args  # tests/test_cli_e2e.py

    from thinkrl.run.jsonl import read_jsonl

    invoke(tiny_args(model_dir, tmp_path / "straight", steps, *extra))
    invoke(tiny_args(model_dir, tmp_path / "split", stop_at, *extra))
    invoke(["train", "--resume", str(tmp_path / "split"), "-o", f"train.steps={steps}"])
    return read_jsonl(tmp_path / "straight" / "metrics.jsonl"), read_jsonl(tmp_path / "split" / "metrics.jsonl")
