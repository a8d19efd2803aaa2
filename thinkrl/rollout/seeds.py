"""Thinking Seeds: completions that start from a prefix written by one of the model's own earlier checkpoints.

Paper: "Thinking Seeds: Leveraging Historical Diversity for Position-Aware RL in LLMs", arXiv 2601.21476 (v1:
"SOUP"). Only the abstract is public; the rollout rule below (docs/methods.md, thinking_seeds) is all INTERPRETATION
except that prefixes come from the model's own historical checkpoints and continuations are on-policy.

    pool      every seeds.every steps the current trainable weights join a FIFO of seeds.pool_size entries
              (the initial policy pinned on top with seeds.keep_initial); LoRA adapters stay in memory, full
              weights go to RUN_DIR/seeds/. Checkpoints carry the pool, so --resume restores it.
    per group seeds.per_group of the G completions are seeded, each from a checkpoint drawn uniformly among
              those older than the current step (none yet: the step is plain on-policy)
    prefix    fraction: the checkpoint writes a whole completion y^h, L = max(1, floor(u |y^h|)),
              u ~ U(frac_min, frac_max); tokens: it writes L ~ U{tokens_min..tokens_max} tokens. EOS is never
              part of a prefix; seeds.snap cuts back to the last line/sentence end inside it; L < budget.
    continue  the current sampler continues from prompt + prefix within the remaining budget
    record    prefix tokens carry the checkpoint's log-probs as behav_logp and prefix_len marks the boundary,
              so any method can see prefix_mask; thinking_seeds uses pi_theta / pi_hist there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from thinkrl import distributed
from thinkrl.rollout.completions import Completions, Request, Sampling
from thinkrl.rollout.engines import Engine

SNAP_ENDS = {"line": ("\n",), "sentence": ("\n", ".", "!", "?")}


@dataclass
class Entry:
    step: int  # policy after this many steps
    weights: dict[str, Tensor] | None = None  # in memory
    path: Path | None = None  # on disk (full fine-tuning)
    pinned: bool = False


class SeedPool:
    """The historical checkpoints Thinking Seeds samples prefixes from."""

    def __init__(self, cfg, directory: Path, on_disk: bool) -> None:
        self.cfg, self.directory, self.on_disk = cfg, Path(directory), on_disk
        self.entries: list[Entry] = []

    def due(self, step: int) -> bool:
        """Whether the weights at the start of `step` join the pool (the same answer on every rank: under FSDP
        taking them is a gather, so it is asked first)."""
        return not step % self.cfg.every and not any(e.step == step for e in self.entries)

    def maybe_add(self, step: int, weights: dict[str, Tensor]) -> bool:
        """At the start of `step` (= steps completed): add the current weights when step % every == 0."""
        if not self.due(step):
            return False
        entry = Entry(step, pinned=step == 0 and self.cfg.keep_initial)
        if self.on_disk:
            self.directory.mkdir(parents=True, exist_ok=True)
            entry.path = self.directory / f"step-{step}.pt"
            torch.save({n: t.cpu() for n, t in weights.items()}, entry.path)
        else:
            entry.weights = {n: t.detach().clone() for n, t in weights.items()}
        self.entries.append(entry)
        fifo = [e for e in self.entries if not e.pinned]
        for old in fifo[: max(0, len(fifo) - self.cfg.pool_size)]:  # first in, first out
            self.entries.remove(old)
            if old.path is not None:
                old.path.unlink(missing_ok=True)  # checkpoints hold their own hard links
        return True

    def older_than(self, step: int) -> list[Entry]:
        return [e for e in self.entries if e.step < step]

    def weights(self, entry: Entry, device) -> dict[str, Tensor]:
        if entry.weights is not None:
            return entry.weights
        return {n: t.to(device) for n, t in torch.load(entry.path, weights_only=True).items()}

    # -- checkpoints: memory entries are saved in seeds.pt, disk entries hard-linked into the checkpoint
    def save(self, ckpt: Path) -> None:
        meta = [{"step": e.step, "pinned": e.pinned} for e in self.entries]
        if self.on_disk:
            (ckpt / "seeds").mkdir()
            for e in self.entries:
                _link_or_copy(e.path, ckpt / "seeds" / e.path.name)
            torch.save({"entries": meta}, ckpt / "seeds.pt")
        else:
            torch.save({"entries": meta, "weights": [{n: t.cpu() for n, t in e.weights.items()} for e in self.entries]}, ckpt / "seeds.pt")

    def load(self, ckpt: Path, device) -> None:
        if not (ckpt / "seeds.pt").is_file():
            return
        state = torch.load(ckpt / "seeds.pt", weights_only=True)
        self.entries = []
        for i, meta in enumerate(state["entries"]):
            entry = Entry(meta["step"], pinned=meta["pinned"])
            if self.on_disk:
                self.directory.mkdir(parents=True, exist_ok=True)
                entry.path = self.directory / f"step-{entry.step}.pt"
                if not entry.path.exists():
                    _link_or_copy(ckpt / "seeds" / entry.path.name, entry.path)
            else:
                entry.weights = {n: t.to(device) for n, t in state["weights"][i].items()}
            self.entries.append(entry)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem: a copy
        import shutil

        shutil.copyfile(src, dst)


def _prefix_lengths(hist: Completions, cfg, budget: int, rng: torch.Generator, tok) -> list[int]:
    """L per historical row: the rule of the module docstring, never past EOS and below the budget."""
    out = []
    for i in range(hist.tokens.shape[0]):
        n = int(hist.lengths[i]) - (0 if bool(hist.truncated[i]) else 1)  # generated tokens without the EOS
        if cfg.prefix == "fraction":
            u = cfg.frac_min + (cfg.frac_max - cfg.frac_min) * float(torch.rand((), generator=rng, device=rng.device))
            L = max(1, int(u * n))
        else:
            L = int(torch.randint(cfg.tokens_min, cfg.tokens_max + 1, (), generator=rng, device=rng.device))
        L = max(0, min(L, n, budget - 1))
        if cfg.snap != "none" and L > 1:
            pieces = [tok.decode([t]) for t in hist.tokens[i, :L].tolist()]
            ends = [j for j, text in enumerate(pieces) if text.rstrip(" ").endswith(SNAP_ENDS[cfg.snap])]
            L = ends[-1] + 1 if ends else L  # no boundary inside: keep the raw cut
        out.append(L)
    return out


def seeded_generate(engine: Engine, sampler, pool: SeedPool, step: int, req: Request, tok) -> Completions:
    """req's G completions per prompt, the last seeds.per_group of each group seeded (when the pool has an older
    checkpoint); adds prefix_len and seed_step to the Completions. Every sample goes through `engine`."""
    candidates, cfg = pool.older_than(step), pool.cfg
    model = sampler.restore()
    if not candidates:  # nothing older than the current policy yet: plain on-policy sampling
        comp = engine.generate(model, req)
        comp.prefix_len = torch.zeros(comp.tokens.shape[0], dtype=torch.long, device=comp.tokens.device)
        comp.seed_step = torch.full_like(comp.prefix_len, -1)
        return comp
    prompts, G, sampling, gen, pad = req.prompts, req.group_size, req.sampling, req.generator, req.pad_id
    S, P, T = cfg.per_group, len(prompts), sampling.max_new_tokens
    plain = engine.generate(model, replace(req, group_size=G - S))  # (P * (G - S), T1)
    # which checkpoint seeds each of the P * S seeded rows, then the prefixes, one checkpoint at a time
    pick = torch.randint(len(candidates), (P * S,), generator=gen, device=gen.device).tolist()
    rows_prompt = [p for p in range(P) for _ in range(S)]
    prefixes: list[tuple[list[int], list[float]]] = [([], [])] * (P * S)
    hist_sampling = Sampling(T if cfg.prefix == "fraction" else cfg.tokens_max, sampling.temperature, sampling.top_p, sampling.top_k)
    device = next(model.parameters()).device
    # several processes: every rank rebuilds the checkpoints any rank drew, in one order, since under FSDP a
    # rebuild gathers the frozen base weights from every rank (a rank with no row of one only takes part)
    drawn = sorted({c for picks in distributed.all_gather(sorted(set(pick))) for c in picks})
    for c in drawn:
        entry, rows = candidates[c], [r for r in range(P * S) if pick[r] == c]
        hist_model = sampler.historical(pool.weights(entry, device))
        if not rows:
            continue
        hist = engine.generate(
            hist_model, replace(req, prompts=[prompts[rows_prompt[r]] for r in rows], group_size=1, sampling=hist_sampling)
        )
        for j, (r, L) in enumerate(zip(rows, _prefix_lengths(hist, cfg, T, gen, tok))):
            prefixes[r] = (hist.tokens[j, :L].tolist(), hist.behav_logp[j, :L].tolist())
    model = sampler.restore()
    # the current policy continues every seeded row, each within its own budget T - L
    short = min(len(p[0]) for p in prefixes)
    cont_sampling = Sampling(T - short, sampling.temperature, sampling.top_p, sampling.top_k)
    starts, budgets = [prompts[rows_prompt[r]] + prefixes[r][0] for r in range(P * S)], [T - len(p[0]) for p in prefixes]
    cont = engine.generate(model, replace(req, prompts=starts, group_size=1, sampling=cont_sampling, budgets=budgets))
    seeded = _join(prefixes, cont, T, pad, device)
    seed_step = torch.tensor([candidates[c].step if prefixes[r][0] else -1 for r, c in enumerate(pick)], device=device)
    seeded.seed_step = seed_step
    return _interleave(plain, seeded, G - S, S, pad)


def _join(prefixes, cont: Completions, T: int, pad: int, device) -> Completions:
    """prefix + continuation per row, each continuation cut to its own budget T - L."""
    rows = []
    for r, (ids, logps) in enumerate(prefixes):
        L, budget = len(ids), T - len(ids)
        n = min(int(cont.lengths[r]), budget)
        finished = not bool(cont.truncated[r]) and int(cont.lengths[r]) <= budget
        rows.append((ids + cont.tokens[r, :n].tolist(), logps + cont.behav_logp[r, :n].tolist(), L, not finished))
    width = max(len(r[0]) for r in rows)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    behav = torch.zeros((len(rows), width), device=device)
    for i, (ids, logps, _, _) in enumerate(rows):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        behav[i, : len(ids)] = torch.tensor(logps)
    lengths = torch.tensor([len(r[0]) for r in rows], device=device)
    mask = torch.arange(width, device=device)[None] < lengths[:, None]
    comp = Completions(tokens, behav, mask, lengths, torch.tensor([r[3] for r in rows], device=device))
    comp.prefix_len = torch.tensor([r[2] for r in rows], device=device)
    return comp


def _interleave(plain: Completions, seeded: Completions, n_plain: int, n_seeded: int, pad: int) -> Completions:
    """Groups of [n_plain unseeded rows, n_seeded seeded rows] per prompt, in prompt order."""
    P = plain.tokens.shape[0] // n_plain
    plain.prefix_len = torch.zeros(plain.tokens.shape[0], dtype=torch.long, device=plain.tokens.device)
    plain.seed_step = torch.full_like(plain.prefix_len, -1)
    parts = []
    for p in range(P):
        parts.append(plain.select(torch.arange(p * n_plain, (p + 1) * n_plain, device=plain.tokens.device)))
        parts.append(seeded.select(torch.arange(p * n_seeded, (p + 1) * n_seeded, device=plain.tokens.device)))
    return Completions.cat(parts, pad)
