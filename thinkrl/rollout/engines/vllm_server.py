"""The vLLM server engine: rollouts sampled over HTTP by a `vllm serve` process on its own devices.

The trainer and the sampler are separate processes (`thinkrl serve` starts the server with the flags below), so
neither holds the other's memory; the price is an adapter push per step and JSON over HTTP per completion. The
server samples the base weights plus the policy's LoRA adapters, pushed before each rollout whenever they
changed (server_adapters.py) under the name `policy-{run}-v{N}`, N = training steps behind those weights: the
trainer's step minus rollout.staleness (the sampler's snapshot of k steps ago), which is the lag the off-policy
corrections assume. With several trainer processes the weights are the same on every rank, so rank 0 alone
pushes, once per step, and tells the others the name (one collective at each step's first rollout, which every
rank makes; evaluation runs on rank 0 alone and calls none). The step's `rollout/policy_version` and
`rollout/policy_lag` go to metrics.jsonl.

Sampling as in vllm.py: one request per completion with its own seed from the step's generator; behav_logp is
the sampled token's log-prob under the tempered, truncated distribution (the server runs with
--logprobs-mode processed_logprobs); token ids come back as ids (return_token_ids), never re-tokenised text.
Entropy records are not available. A server that stops answering ends the run in one line (server_http.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from thinkrl import distributed
from thinkrl.errors import UserError
from thinkrl.rollout.completions import Completions, Request
from thinkrl.rollout.engines import Engine
from thinkrl.rollout.engines.server_adapters import AdapterPush, run_tag
from thinkrl.rollout.engines.server_http import ServerClient, ServerRefused
from thinkrl.rollout.sampling import draw_seeds

HEALTH_TIMEOUT = 30.0  # seconds: the check at start waits at most this (or rollout.server_timeout, if shorter)


class VLLMServerEngine(Engine):
    name = "vllm_server"

    def __init__(self, slots: int = 64, **options: Any) -> None:
        super().__init__(slots, **options)
        run_dir = options.get("run_dir")
        restart = f"thinkrl serve {run_dir}/config.yaml" if run_dir else "thinkrl serve CONFIG"
        self.client = ServerClient(
            options.get("url") or "rollout.server_url", options.get("timeout", 600.0), restart, lambda: _then(run_dir)
        )
        self.decoder = f"vLLM server at {self.client.url}, LoRA adapters pushed after each update"
        self.run = run_tag(run_dir) if run_dir else ""
        self.sampler = None
        self.push: AdapterPush | None = None
        self.trainer_version: int | None = None  # the trainer's step at the last training rollout
        self.shared: tuple[int, str] | None = None  # (step, adapter name) rank 0 pushed for the step's rollouts

    def bind(self, sampler) -> None:
        self.sampler = sampler

    def connect(self) -> None:
        """GET /health before the first step: a server that is not there is one line, not a stuck run."""
        self.client.health(min(HEALTH_TIMEOUT, self.client.timeout))

    def policy(self, req: Request) -> tuple[int, int, dict]:
        """(version, lag, adapters) this request samples with. A training rollout (req.step set) samples the
        sampler's snapshot of rollout.staleness steps ago (fewer at the start); a request without a step
        (evaluation during training, after the update) the trainer's current weights, one step on."""
        s = self.sampler
        # the adapters the sampler's merged copy holds, as its last restore() chose them: read, not gathered again, since
        # under FSDP a gather needs every rank and evaluation samples on rank 0 only
        held = s.adapters
        if req.step is None:
            version = 0 if self.trainer_version is None else self.trainer_version + 1
            if held is None and distributed.world()[1] > 1:  # a snapshot would gather from ranks that are not here
                raise RuntimeError("evaluation on rank 0: the sampler holds no adapters to push (refresh it on every rank first)")
            return version, 0, held if held is not None else s.snapshot()
        self.trainer_version = req.step
        lag = len(s.history) - 1 if s.staleness and len(s.history) > 1 else 0
        if lag != min(s.staleness, req.step):  # the corrections assume exactly rollout.staleness (capped at the start)
            raise RuntimeError(f"step {req.step + 1}: the sampler holds weights {lag} steps old, not rollout.staleness={s.staleness}")
        if held is None:
            held = s.history[0] if lag else s.snapshot()
        return req.step - lag, lag, held

    def generate(self, model, req: Request) -> Completions:
        if req.record_entropy:
            raise UserError(
                "rollout.engine=vllm_server cannot record the sampler's entropy (train.old_policy=sampler with a method that "
                "needs old_entropy); use train.old_policy=recompute or another engine"
            )
        if self.sampler is None or not getattr(self.sampler, "lora", False):
            raise UserError("rollout.engine=vllm_server samples thinkrl train's LoRA policy only; use rollout.engine=vllm here")
        version, lag, adapters = self.policy(req)
        name = self._adapter(req, version, adapters)
        seeds = draw_seeds(req.generator, req.rows, 2**31 - 1)
        bodies = [_body(name, req, p, seed, n) for p, seed, n in zip(req.each_completion(), seeds, req.limits())]
        # vLLM answers with the name asked for, so an answer cannot show a wrong adapter: a name only this run loads
        # and unloads (run_tag) keeps other runs' weights out, and an adapter unloaded under it is a 404, one line
        with ThreadPoolExecutor(max_workers=max(1, min(self.slots, len(bodies)))) as pool:  # the server batches them
            answers = list(pool.map(self._complete, bodies))
        self.stats = {"rollout/policy_version": float(version), "rollout/policy_lag": float(lag)}
        return _completions(answers, req, next(model.parameters()).device)

    def _adapter(self, req: Request, version: int, adapters: dict) -> str:
        """The name of the adapter this request samples with, pushed by rank 0. Training rollouts: the step's first
        one on every rank gathers rank 0's outcome (the name, or its error: the others stop too rather than wait);
        later rounds of the step (dynamic sampling, which ranks run in different numbers) reuse the name.
        Evaluation (no step) runs on rank 0 alone: it pushes and calls no collective."""
        rank, world = distributed.world()
        if world == 1 or req.step is None:
            return self._pusher().push(version, adapters)
        if self.shared is not None and self.shared[0] == req.step:
            return self.shared[1]
        said: tuple[str, str] = ("", "")
        failed: Exception | None = None
        if rank == 0:
            try:
                said = (self._pusher().push(version, adapters), "")
            except Exception as e:  # any failure: the other ranks must hear of it, not wait for a name forever
                failed, said = e, ("", str(e) if isinstance(e, UserError) else f"rank 0 could not push the adapter: {e!r}")
        name, error = distributed.all_gather(said)[0]
        if failed is not None:
            raise failed
        if error:
            raise UserError(error)
        self.shared = (req.step, name)
        return name

    def _pusher(self) -> AdapterPush:
        if self.push is None:
            policy = self.sampler.policy  # type: ignore[union-attr]
            adapter = policy.active_adapter if isinstance(policy.active_adapter, str) else "default"
            root = self.options.get("adapter_dir") or ""
            self.push = AdapterPush(self.client, policy.peft_config[adapter], adapter, self.run, root)
        return self.push

    def _complete(self, body: dict) -> dict:
        try:
            return self.client.post("/v1/completions", body, f"sampling with adapter {body['model']}")
        except ServerRefused as e:
            raise UserError(
                f"{e}; the server must take prompt + rollout.max_new_tokens tokens (thinkrl serve sets --max-model-len from the "
                "run's config) and the adapter must be loaded"
            ) from None

    def close(self) -> None:
        if self.push is not None:
            self.push.close()


def _then(run_dir: str | None) -> str:
    """How to continue after the server is back: resume from the last checkpoint, or, before the first one, run the
    same command again (a --resume of a directory with no checkpoint has nothing to resume)."""
    # the run directory's layout (thinkrl/run/checkpoint.py), read here: rollout/ does not import run/
    if run_dir and any((Path(run_dir) / "checkpoints").glob("step-*/COMPLETE")):  # a complete checkpoint
        return f"then continue with: thinkrl train --resume {run_dir} (the last checkpoint stands)"
    return "then run the same thinkrl train command again (no checkpoint was saved yet)"


def _body(name: str, req: Request, prompt: list[int], seed: int, budget: int) -> dict:
    s, greedy = req.sampling, req.sampling.temperature == 0
    return {
        "model": name,
        "prompt": list(prompt),  # token ids: the server does not tokenise
        "max_tokens": budget,
        "min_tokens": s.min_new_tokens,
        "temperature": 0.0 if greedy else s.temperature,
        "top_p": 1.0 if greedy else s.top_p,
        "top_k": 0 if greedy else s.top_k,
        "seed": seed,
        "stop_token_ids": list(req.eos_ids),
        "ignore_eos": not req.eos_ids,  # no end ids given: every completion runs to its budget
        "logprobs": req.record_topk,  # the sampled token's log-prob always comes, with the top-K when asked
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }


def _completions(answers: list[dict], req: Request, device) -> Completions:
    rows = [_row(a) for a in answers]
    R, T, K = len(rows), max((len(ids) for ids, _, _ in rows), default=0), req.record_topk
    tokens = torch.full((R, T), req.pad_id, dtype=torch.long)
    behav = torch.zeros((R, T), dtype=torch.float32)
    topk_ids = torch.zeros((R, T, K), dtype=torch.long) if K else None
    topk_logp = torch.zeros((R, T, K), dtype=torch.float32) if K else None
    for i, (ids, logps, tops) in enumerate(rows):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        behav[i, : len(ids)] = torch.tensor(logps, dtype=torch.float32)
        for t, top in enumerate(tops if K else []):
            ranked = sorted(top.items(), key=lambda kv: -kv[1])[:K]  # the sampled token comes too: keep the K best
            for k, (tid, lp) in enumerate(ranked):
                topk_ids[i, t, k], topk_logp[i, t, k] = tid, max(lp, -1e4)  # type: ignore[index]
    lengths = torch.tensor([len(ids) for ids, _, _ in rows], dtype=torch.long)
    ended = torch.tensor([bool(ids) and ids[-1] in req.eos_ids for ids, _, _ in rows])
    mask = torch.arange(T)[None] < lengths[:, None]
    move = lambda x: x.to(device) if x is not None else None  # noqa: E731
    return Completions(move(tokens), move(behav), move(mask), move(lengths), move(~ended), move(topk_ids), move(topk_logp))


def _row(answer: dict) -> tuple[list[int], list[float], list[dict[int, float]]]:
    """A completion's token ids, their log-probs and top log-probs by id, checked against each other."""
    choice = answer["choices"][0]
    ids, lp = [int(t) for t in choice.get("token_ids") or []], choice.get("logprobs") or {}
    said = lp.get("tokens") or []
    if said != [f"token_id:{t}" for t in ids] or len(lp.get("token_logprobs") or []) != len(ids):
        raise UserError(
            "the vLLM server's answer does not give each sampled token's id and log-prob; it needs vLLM 0.14 or newer "
            "(return_token_ids, return_tokens_as_token_ids): start it with `thinkrl serve`"
        )
    tops = [{int(k.removeprefix("token_id:")): float(v) for k, v in (top or {}).items()} for top in lp.get("top_logprobs") or []]
    return ids, [float(x) for x in lp["token_logprobs"]], tops
