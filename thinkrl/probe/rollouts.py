"""The probe's rollouts: sampled groups with what pi_old (theta0) contributes to a probed loss, and
the forward passes the measures run over them (thinkrl/probe/measure.py, replicates.py)."""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.batch import TokenBatch
from thinkrl.config import Config
from thinkrl.forward import hidden_states, tempered_logits
from thinkrl.learner.advantages import compute_advantages
from thinkrl.learner.batching import RolloutBatch
from thinkrl.learner.logprobs import token_logprobs
from thinkrl.learner.old_policy import token_js
from thinkrl.methods import Method
from thinkrl.rollout.collect import StepSamples


class Rollouts:
    """Sampled groups with what pi_old (theta0) contributes: its log-probs (the sampler's, or recompute_old's), its
    entropy when a probed method reads old_entropy (one no-grad pass); its JS scores and top-K when asked
    (score_js, record_topk)."""

    def __init__(self, samples: StepSamples, policy, pad: int, temperature: float, old_entropy: bool = False) -> None:
        self.s, self.pad, self.temperature = samples, pad, temperature
        self.prompt_ids = [p.ids for p in samples.prompts for _ in range(samples.group_size)]
        self.old_logp, self.old_entropy = samples.comp.behav_logp, None  # (B, T)
        self.old_js: Tensor | None = None  # (B, T) pi_old's JS scores, each replicate's against its own batch
        self.topk_ids: Tensor | None = None  # (B, T, K) pi_old's K most likely ids at each position: sis's proposal
        self.topk_old_logp: Tensor | None = None  # (B, T, K) pi_old's log-probs there
        if old_entropy:
            with torch.no_grad():
                self.old_entropy = torch.cat([self._padded(self.logprobs(policy, rows, entropy=True).entropy) for rows in self.chunks()])

    @torch.no_grad()
    def recompute_old(self, policy) -> None:
        """pi_old from the trainer's weights now in place (theta0) instead of the sampler's log-probs: what a run
        with train.old_policy=recompute trains against when the sampler differs from the trainer (fp8)."""
        old = torch.cat([self._padded(self.logprobs(policy, rows).logp) for rows in self.chunks()])  # (B, T)
        self.old_logp = old.to(self.s.comp.behav_logp.device)

    def mismatch_k3(self) -> float:
        """Mean over generated tokens of the k3 estimate of KL(mu || pi_old): 0 when pi_old is the sampler."""
        mask = self.s.comp.mask.bool()
        log_rho = (self.old_logp - self.s.comp.behav_logp)[mask].double()  # (N,) log pi_old / mu
        return float((log_rho.exp() - 1 - log_rho).mean()) if mask.any() else 0.0

    def _padded(self, x: Tensor) -> Tensor:
        return torch.nn.functional.pad(x, (0, self.s.comp.tokens.shape[1] - x.shape[1]))

    def group_rows(self, groups: Tensor) -> Tensor:
        """The rows of these groups, in order.  (g,) -> (g * G,)"""
        G = self.s.group_size
        return (groups[:, None] * G + torch.arange(G)).reshape(-1)

    def logprobs(self, policy, rows: Tensor, entropy: bool = False, entropy_grad: bool = False, topk: bool = False):
        comp = self.s.comp
        T = int(comp.lengths[rows].max())
        ids = [self.prompt_ids[i] for i in rows.tolist()]
        at = self.topk_ids[rows, :T].to(comp.tokens.device) if topk and self.topk_ids is not None else None  # (b, T, K), kept on the CPU
        return token_logprobs(policy, ids, comp.tokens[rows, :T], comp.mask[rows, :T], self.pad, self.temperature, entropy, at, False,
                              frozenset(), entropy_grad, packed=True)  # fmt: skip

    @torch.no_grad()
    def record_topk(self, policy, K: int) -> None:
        """pi_old's top-K ids and log-probs at every generated position (run with pi_old's weights in place)."""
        comp = self.s.comp
        B, T = comp.tokens.shape
        self.topk_ids, self.topk_old_logp = torch.zeros((B, T, K), dtype=torch.long), torch.zeros((B, T, K))
        for rows in self.chunks():
            top = self.distribution(policy, rows).topk(K, dim=-1)  # (n, K), positions row-major like the mask
            r, c = comp.mask[rows, : int(comp.lengths[rows].max())].nonzero(as_tuple=True)
            self.topk_ids[rows[r], c], self.topk_old_logp[rows[r], c] = top.indices.cpu(), top.values.cpu()

    def batch(
        self, method: Method, rows: Tensor, logp: Tensor, entropy: Tensor | None, topk_logp: Tensor | None = None, **counts: int
    ) -> TokenBatch:
        """The TokenBatch of `rows` (whole groups) for `method`, with its own advantage estimator; `counts`: the
        global num_tokens / num_seqs when `rows` is one chunk of a larger batch."""
        comp, G, T = self.s.comp, self.s.group_size, logp.shape[1]
        adv, _ = compute_advantages(self.s.rewards[rows], G, method.advantage)  # (b,)
        on = lambda x: x.to(logp.device)  # noqa: E731  (the top-K is kept on the CPU)
        return TokenBatch(
            logp=logp,
            old_logp=self.old_logp[rows, :T],
            behav_logp=comp.behav_logp[rows, :T],
            advantages=adv.to(logp.device),
            mask=comp.mask[rows, :T],
            token_ids=comp.tokens[rows, :T],
            entropy=entropy,
            old_entropy=self.old_entropy[rows, :T] if self.old_entropy is not None else None,
            token_js=self.old_js[rows, :T] if self.old_js is not None else None,
            topk_ids=on(self.topk_ids[rows, :T]) if topk_logp is not None and self.topk_ids is not None else None,
            topk_old_logp=on(self.topk_old_logp[rows, :T]) if topk_logp is not None and self.topk_old_logp is not None else None,
            topk_logp=topk_logp,
            # a method's random draws: the same for a replicate on every run (on the device: CUDA refuses a CPU generator there)
            generator=torch.Generator(device=logp.device).manual_seed(int(rows[0])),
            **counts,
        )

    def score_js(self, policy, cfg: Config, method: Method, batches: list[Tensor]) -> None:
        """pi_old's JS scores (what ict ranks tokens by), each batch of rows against its own mean distribution, as
        the trainer's pi_old pass scores the batch a loss sees. Run with pi_old's weights (before stale steps)."""
        comp = self.s.comp
        self.old_js = torch.zeros(comp.tokens.shape)
        for rows in batches:
            rb = RolloutBatch([self.prompt_ids[i] for i in rows.tolist()], comp.select(rows), torch.zeros(len(rows)), self.s.group_size)
            js = token_js(policy, rb, method, cfg, self.pad)  # (b, T')
            self.old_js[rows, : js.shape[1]] = js.cpu()

    def distribution(self, policy, rows: Tensor) -> Tensor:
        """The tempered next-token log-distribution at each generated position of `rows`.  (n, V)"""
        comp = self.s.comp
        T = int(comp.lengths[rows].max())
        ids = [self.prompt_ids[i] for i in rows.tolist()]
        h, _, head, config = hidden_states(policy, ids, comp.tokens[rows, :T], comp.mask[rows, :T], self.pad, packed=True)
        return torch.log_softmax(tempered_logits(head, config, h, self.temperature), -1)

    def chunks(self, groups: Tensor | None = None, per_chunk: int = 2) -> list[Tensor]:
        """The rows of `groups` (default: all) in chunks of whole groups: one forward each keeps memory small."""
        groups = torch.arange(len(self.s.prompts)) if groups is None else groups
        return [self.group_rows(groups[i : i + per_chunk]) for i in range(0, len(groups), per_chunk)]
