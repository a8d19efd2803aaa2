"""The probe's replicates: every method's gradient on each replicate's mini-batch, and what it would do
(the measures, thinkrl/probe/measure.py).

Replicates run several at a time where the CPU's fused LoRA layers can split a gradient by replicate
(accel.segment_grads): one forward over all of them and, per method, one backward of the sum of their losses,
each replicate's own gradient kept apart by the layers. A replicate's few short completions make small
matrices, which a CPU multiplies far below its peak (docs/benchmarks.md measures the gain per pass size). A
pass holds up to PASS_TOKENS tokens (its activations grow with them), so long completions still run one by
one. Elsewhere (a GPU, THINKRL_ACCEL=0, layers the fusion does not cover, two replicates that share a prompt)
they run one by one, with the same numbers up to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from thinkrl import accel
from thinkrl.learner import method_calls
from thinkrl.probe.measure import CLIP_KEYS, Directions, ProbeArm, ProbeSettings, as_arm, flat_grad, probe_pass
from thinkrl.probe.rollouts import Rollouts

REPORTED = ("ais/", "sis/", "ctpo/", "clip/", "mask/")  # the method metrics kept per replicate
PASS_TOKENS = 768  # prompt and completion tokens of the replicates one pass takes together (at least one replicate)


def replicate_rows(data: Rollouts, ps: ProbeSettings) -> list[Tensor]:
    """Replicate r's rows: groups [stale_prompts + r * groups, ...) of the rollouts, each used once."""
    first = [ps.stale_prompts + r * ps.groups for r in range(ps.replicates)]
    return [data.group_rows(torch.arange(f, f + ps.groups)) for f in first]


def run_replicates(policy, params, data: Rollouts, d: Directions, ps: ProbeSettings, advance) -> list[dict[str, dict]]:
    """Every replicate's measures, in order; `advance(n)` after each n done."""
    rows, arms = replicate_rows(data, ps), list(ps.methods)
    results, together = [], True
    with probe_pass(policy):
        for parts in _passes(data, rows):
            got = None
            if together and len(parts) > 1 and _apart(data, parts):
                got = _together(policy, params, data, arms, parts, d)
                together = got is not None  # the fused layers are off or do not cover this model: one by one from here
            if got is not None:
                results += got
                advance(len(parts))
                continue
            for r in parts:
                results.append(replicate(policy, params, data, arms, r, d))
                advance(1)
    return results


def _passes(data: Rollouts, rows: list[Tensor]) -> list[list[Tensor]]:
    """Consecutive replicates in passes of at most PASS_TOKENS tokens (each prompt once per group, as the
    forward runs it), one replicate alone when it has more."""
    G, lengths = data.s.group_size, data.s.comp.lengths.tolist()
    passes, tokens = [[]], 0
    for r in rows:
        n = sum(lengths[i] for i in r.tolist()) + sum(len(data.prompt_ids[i]) for i in r.tolist()[::G])
        if passes[-1] and tokens + n > PASS_TOKENS:
            passes.append([])
            tokens = 0
        passes[-1].append(r)
        tokens += n
    return [p for p in passes if p]


def replicate(policy, params, data: Rollouts, arms: list[str | ProbeArm], rows: Tensor, d: Directions) -> dict[str, dict]:
    """One mini-batch, every method's gradient on it, and what each would do."""
    out = _measure_parts(policy, params, data, arms, [rows], d, None)
    assert out is not None  # only a split gradient can be refused
    return out[0]


def _together(policy, params, data: Rollouts, arms: list, parts: list[Tensor], d: Directions) -> list[dict[str, dict]] | None:
    """`parts` in one pass with each one's gradient from the fused layers; None where they cannot split it."""
    with accel.segment_grads(len(parts)) as seg:
        return None if seg is None else _measure_parts(policy, params, data, arms, parts, d, seg)


def _apart(data: Rollouts, parts: list[Tensor]) -> bool:
    """Whether the parts can be told apart by rows in every layer's input: equally many groups each, and no
    prompt shared between groups (the forward runs each distinct prompt once, in one row)."""
    rows = torch.cat(parts).tolist()
    return len({len(p) for p in parts}) == 1 and len({tuple(data.prompt_ids[i]) for i in rows}) * data.s.group_size == len(rows)


def _measure_parts(policy, params, data: Rollouts, arms: list, parts: list[Tensor], d: Directions, seg) -> list[dict[str, dict]] | None:
    """Each part's measures for every method, from one forward over all parts. Each method is built afresh per
    part, so a controller that begin_step moves (stare's, ais's) starts every replicate in the same state.
    `seg`: the fused layers' split gradients (several parts), or None (one part, autograd's own gradient);
    None back when the split did not cover every parameter."""
    labels = [as_arm(a).label for a in arms]
    methods = [[as_arm(a).build() for a in arms] for _ in parts]
    reads = {r for m in methods[0] for r in m.requires}
    lp = data.logprobs(policy, torch.cat(parts), entropy="entropy" in reads, topk="topk_logp" in reads)
    if seg is not None and not seg.covers(params):
        return None
    ends = torch.tensor([len(p) for p in parts]).cumsum(0).tolist()
    spans = [slice(e - len(p), e) for e, p in zip(ends, parts)]
    out: list[dict[str, dict]] = [{} for _ in parts]
    ref_norm = float(d.g_ref.norm())
    for j, label in enumerate(labels):
        losses, metrics = zip(*(_loss(ms[j], data, p, lp, s) for ms, p, s in zip(methods, parts, spans)))
        total, retain = sum(losses), j < len(labels) - 1
        if seg is None:
            grads = flat_grad(total, params, retain)[None]  # (1, P)
        else:
            torch.autograd.grad(total, params, retain_graph=retain, allow_unused=True)  # the sum; seg keeps each part's
            grads = seg.flat(params)  # (parts, P)
        for k, (g, m) in enumerate(zip(grads, metrics)):
            out[k][label] = _measures(g, m, d, ref_norm)
    return out


def _loss(m, data: Rollouts, rows: Tensor, lp, span: slice):
    """One method's loss and metrics on one part: its rows of the shared forward, cut to their own length."""
    T = int(data.s.comp.lengths[rows].max())
    entropy = lp.entropy[span, :T].detach() if lp.entropy is not None else None
    at_topk = lp.topk_logp[span, :T] if "topk_logp" in m.requires and lp.topk_logp is not None else None
    batch = data.batch(m, rows, lp.logp[span, :T], entropy, at_topk)
    began = method_calls.begin_step(m, replace(batch, logp=batch.logp.detach()))  # e.g. ais's alpha for this batch
    loss, metrics = method_calls.loss(m, batch)
    return loss, {**began, **metrics}


def _measures(g: Tensor, metrics: dict, d: Directions, ref_norm: float) -> dict:
    """What the update -g would do, against the reference directions (ref_norm: |d.g_ref|)."""
    norm = float(g.norm())
    cos = float(-(g @ d.g_ref)) / (norm * ref_norm) if norm > 0 and ref_norm > 0 else None  # no update, no direction
    clip = next((float(metrics[k]) for k in CLIP_KEYS if k in metrics), None)
    slopes = {"entropy_slope": float(-(g @ d.g_h)), "kl_slope": float(-(g @ d.g_kl))}
    if d.g_h2 is not None:
        slopes["renyi2_slope"] = float(-(g @ d.g_h2))
    units = {f"{k}_unit": v / norm if norm > 0 else None for k, v in slopes.items() if k != "kl_slope"}
    # e.g. ais's alpha, sis's acceptance; a metric with nothing to average (nan) is left out, as JSON has no nan
    extra = {k: float(v) for k, v in metrics.items() if k.startswith(REPORTED) and math.isfinite(float(v))}
    return {"grad_norm": norm, "cos_ref": cos, **slopes, "clip_frac": clip, **units, "metrics": extra}
