"""Entropy with its gradient (thinkrl/learner/head.py, logprobs.py, update.py): the fused and the plain head
against autograd through log_softmax, chunked against unchunked, a LoRA model against the plain transformers
forward, and train.entropy_coef / Method.entropy_grad in the update phase. Runs with THINKRL_ACCEL=1 and 0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_update import learner

import thinkrl.forward as forward
import thinkrl.learner.update as update_module
from thinkrl import accel
from thinkrl.errors import UserError
from thinkrl.learner.head import FusedHead, head_logp
from thinkrl.learner.logprobs import dropout_off, token_logprobs
from thinkrl.learner.update import update
from thinkrl.methods import get_method
from thinkrl.settings import load_config

T_ = 0.7  # a temperature != 1: its 1/T must reach every gradient


def _head_case(seed: int = 0, N: int = 9, H: int = 12, V: int = 40):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g) * 0.8
    weight = torch.randn(V, H, generator=g) * 0.8
    targets = torch.randint(0, V, (N,), generator=g)
    up_logp, up_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)  # random upstream gradients
    return hidden, weight, targets, up_logp, up_ent


def _reference(hidden, weight, targets, up_logp, up_ent, temperature=T_):
    """(logp, entropy, d/dhidden, d/dweight) of sum(up_logp * logp + up_ent * H) by autograd in float64."""
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    logp_all = torch.log_softmax(h @ w.t() / temperature, -1)  # (N, V)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    (up_logp.double() * logp + up_ent.double() * ent).sum().backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


def _close(got, want, msg=""):
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=2e-5, msg=msg)


@pytest.mark.parametrize("uses", ["both", "logp", "entropy", "flag off"])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("trainable_head", [False, True])  # frozen: the LoRA case, where only dh (and dh_H) are saved
def test_fused_head_entropy_gradient_matches_autograd(keep, trainable_head, uses):
    """Random upstream gradients on log pi and H at once, or on one alone (the other output sends None); and
    without entropy_grad, H detached and only log pi's gradient flowing (the behaviour before the flag)."""
    hidden, weight, targets, up_logp, up_ent = _head_case()
    zero = torch.zeros_like(up_logp)
    up_logp, up_ent = (zero, up_ent) if uses == "entropy" else (up_logp, up_ent if uses == "both" else zero)
    logp_ref, ent_ref, gh_ref, gw_ref = _reference(hidden, weight, targets, up_logp, up_ent)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_(trainable_head)
    logp, ent = FusedHead.apply(h, w, targets, T_, keep, None, uses != "flag off")
    assert ent.requires_grad == (uses != "flag off")
    parts = {"both": (logp, ent), "entropy": (ent,)}.get(uses, (logp,))  # an output left out sends None backward
    sum((up_ent if x is ent else up_logp) @ x for x in parts).backward()
    _close(logp, logp_ref)
    _close(ent, ent_ref)
    _close(h.grad, gh_ref, "grad to hidden")
    if trainable_head:
        _close(w.grad, gw_ref, "grad to the head's weight")


@pytest.mark.parametrize("keep", [True, False])
def test_fused_head_gradient_is_finite_where_p_underflows(keep):
    """A logit far above the rest drives the others' p to 0 in float32; log p there is -inf, p log p is 0."""
    hidden, weight, targets, up_logp, up_ent = _head_case(seed=3)
    weight[0] = hidden[0] * 400 / hidden[0].square().sum()  # logit 0 of row 0 is 400 / T: p of the others underflows
    _, _, gh_ref, gw_ref = _reference(hidden, weight, targets, up_logp, up_ent)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = FusedHead.apply(h, w, targets, T_, keep, None, True)
    assert (torch.softmax(hidden[:1] @ weight.t() / T_, -1) == 0).any()  # the case is real
    (up_logp * logp + up_ent * ent).sum().backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
    _close(h.grad, gh_ref)
    _close(w.grad, gw_ref)


@pytest.mark.parametrize("with_topk", [False, True])
def test_head_logp_entropy_gradient_matches_autograd(with_topk):
    hidden, weight, targets, up_logp, up_ent = _head_case(seed=4)
    _, ent_ref, gh_ref, gw_ref = _reference(hidden, weight, targets, up_logp, up_ent)
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    h = hidden.clone().requires_grad_()
    topk = torch.arange(3).expand(len(h), 3) if with_topk else None
    logp, ent, _ = head_logp(head, SimpleNamespace(), h, targets, T_, True, topk, entropy_grad=True)
    (up_logp * logp + up_ent * ent).sum().backward()
    _close(ent, ent_ref)
    _close(h.grad, gh_ref)
    _close(head.weight.grad, gw_ref)
    _, ent, _ = head_logp(head, SimpleNamespace(), hidden.clone().requires_grad_(), targets, T_, True, topk)
    assert not ent.requires_grad  # without the flag: detached, as before


def _completions():
    prompts = [[4, 65, 24, 17, 36], [4, 65, 24, 17, 36], [4, 70, 71, 72, 5]]  # two rows share a prompt
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 5])[:, None]  # (3, 6)
    completions = torch.where(mask, torch.randint(7, 100, (3, 6), generator=torch.Generator().manual_seed(1)), 0)
    return prompts, completions, mask


def _lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _entropy_grads(model, topk: bool, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The entropy (B, T) and the gradient of sum(weights * entropy) to the trainable parameters via token_logprobs."""
    prompts, completions, mask = _completions()
    ids = torch.arange(4).expand(*mask.shape, 4) if topk else None  # top-K ids: the plain head_logp path
    model.zero_grad()
    out = token_logprobs(model, prompts, completions, mask, 0, T_, topk_ids=ids, entropy_grad=True)
    assert out.entropy.requires_grad
    w = weights if weights is not None else mask / mask.sum()
    (out.entropy * w).sum().backward()
    return out.entropy.detach(), _lora_grads(model)


@pytest.mark.parametrize("topk", [False, True])  # FusedHead, or head_logp (checkpointed per chunk)
def test_chunked_and_unchunked_entropy_gradients_agree(tiny_model_dir, monkeypatch, topk):
    from tiny import tiny_lora_model

    model = tiny_lora_model(tiny_model_dir)
    weights = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))  # a random upstream gradient
    whole = _entropy_grads(model, topk, weights)
    monkeypatch.setattr(forward, "CHUNK_ELEMS", 3 * model.get_output_embeddings().weight.shape[0])  # chunks of 3 rows
    cut = _entropy_grads(model, topk, weights)
    torch.testing.assert_close(cut[0], whole[0], rtol=1e-5, atol=1e-6)
    assert any(g.abs().max() > 1e-4 for g in whole[1].values())
    for name in whole[1]:
        torch.testing.assert_close(cut[1][name], whole[1][name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("in_update_pass", [False, True])  # with accel's packed head and fused LoRA (when THINKRL_ACCEL=1)
@pytest.mark.plain
def test_lora_entropy_gradient_matches_the_plain_transformers_forward(tiny_model_dir, in_update_pass):
    from tiny import tiny_lora_model

    model = tiny_lora_model(tiny_model_dir)
    prompts, completions, mask = _completions()
    model.zero_grad()
    ents = []
    for b, prompt in enumerate(prompts):  # [prompt | completion] per row, log_softmax over the full logits
        n = int(mask[b].sum())
        logits = model(input_ids=torch.tensor([prompt + completions[b, :n].tolist()])).logits[0]  # (L, V)
        logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + n].float() / T_, -1)  # (n, V)
        ents.append(-(logp.exp() * logp).sum(-1))
    want_ent = torch.cat(ents)
    want_ent.mean().backward()
    want = _lora_grads(model)
    with accel.update_pass(model) if in_update_pass else dropout_off(model):
        got_ent, got = _entropy_grads(model, topk=False)
    torch.testing.assert_close(got_ent[mask], want_ent.detach(), rtol=1e-5, atol=1e-5)
    assert any(g.abs().max() > 1e-4 for g in want.values())
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def _learner(model_dir, method: str, *overrides: str):
    """test_update.py's learner (SGD at lr 0.5, LoRA B drawn nonzero) without gradient clipping: the applied
    gradient is the loss's own."""
    return learner(model_dir, method, "train.grad_clip=0", *overrides)


def _step(ctx, rb) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One update(): the gradient each trainable parameter had at its optimizer step, and the metrics."""
    grads: dict[str, torch.Tensor] = {}
    step = ctx.optimizer.step

    def recording_step(*args, **kwargs):
        grads.update({n: p.grad.clone() for n, p in ctx.policy.named_parameters() if p.requires_grad})
        return step(*args, **kwargs)

    ctx.optimizer.step = recording_step
    metrics = update(ctx, rb, torch.Generator().manual_seed(0))
    return grads, metrics


def _mean_entropy_grad(ctx, rb) -> dict[str, torch.Tensor]:
    """Gradient of the token-mean entropy over the whole batch, at the current parameters."""
    comp, policy = rb.comp, ctx.policy
    policy.zero_grad()
    with dropout_off(policy):
        out = token_logprobs(policy, rb.prompt_ids, comp.tokens, comp.mask, ctx.pad_id, ctx.cfg.rollout.temperature, entropy_grad=True)
    (out.entropy * comp.mask).sum().div(comp.mask.sum()).backward()
    grads = _lora_grads(policy)
    policy.zero_grad()
    return grads


@pytest.mark.plain
def test_entropy_coef_subtracts_the_mean_entropy_gradient(tiny_model_dir):
    ctx, rb = _learner(tiny_model_dir, "grpo")
    plain, _ = _step(ctx, rb)
    ctx, rb = _learner(tiny_model_dir, "grpo", "train.entropy_coef=0.01")
    g_ent = _mean_entropy_grad(ctx, rb)
    bonus, metrics = _step(ctx, rb)
    ctx, rb = _learner(tiny_model_dir, "grpo", "train.entropy_coef=0.01", "train.micro_batch_size=2")
    cut, _ = _step(ctx, rb)
    flat = {k: torch.cat([d[n].flatten() for n in plain]) for k, d in {"plain": plain, "bonus": bonus, "cut": cut, "ent": g_ent}.items()}
    want = -0.01 * flat["ent"]  # g_method - 0.01 x g_entropy: the bonus's own part of the gradient
    assert want.norm() > 1e-5 and (flat["bonus"] - flat["plain"]).norm() > 1e-5  # the coefficient changed the gradient
    # float32 summation order differs between the runs (~1e-8 on gradients of ~1e-2): a norm-relative bound
    assert (flat["bonus"] - flat["plain"] - want).norm() < 1e-2 * want.norm()
    assert (flat["cut"] - flat["bonus"]).norm() < 1e-2 * want.norm()  # micro-batches of 2 rows: the same gradient
    assert metrics["update/entropy_bonus"] == pytest.approx(0.01 * metrics["entropy"], rel=1e-5)


def _spy(ctx, monkeypatch) -> list[dict]:
    """Per training forward: whether its entropy carried grad, and whether the method's batch.entropy did."""
    seen: list[dict] = []
    fwd, loss = update_module._forward, ctx.method.loss

    def recording_forward(*args, **kwargs):
        out, T = fwd(*args, **kwargs)
        seen.append({"forward": out.entropy.requires_grad})
        return out, T

    def recording_loss(batch):
        seen[-1]["batch"] = None if batch.entropy is None else batch.entropy.requires_grad
        return loss(batch)

    monkeypatch.setattr(update_module, "_forward", recording_forward)
    monkeypatch.setattr(ctx.method, "loss", recording_loss)
    return seen


@pytest.mark.parametrize(
    "method, coef, forward_grad, batch_grad",
    [
        ("grpo", "0", False, None),  # nothing needs it: detached, no extra head work
        ("stapo", "0", False, False),  # a gating method reads entropy detached
        ("stapo", "0.01", True, False),  # the bonus needs the gradient; stapo still gets it detached
    ],
)
@pytest.mark.plain
def test_who_gets_a_differentiable_entropy(tiny_model_dir, monkeypatch, method, coef, forward_grad, batch_grad):
    ctx, rb = _learner(tiny_model_dir, method, f"train.entropy_coef={coef}")
    seen = _spy(ctx, monkeypatch)
    update(ctx, rb, torch.Generator().manual_seed(0))
    assert seen and all(s == {"forward": forward_grad, "batch": batch_grad} for s in seen)


@pytest.mark.plain
def test_a_method_with_entropy_grad_trains_through_batch_entropy(tiny_model_dir, monkeypatch):
    """A method that subtracts 0.01 x its own token-mean entropy (entropy_grad = True) gets batch.entropy with
    its gradient, and its update equals grpo's with train.entropy_coef=0.01."""
    grpo = type(get_method("grpo"))

    class Bonus(grpo):
        entropy_grad = True

        @property
        def requires(self) -> set[str]:
            return super().requires | {"entropy"}

        def loss(self, batch):
            loss, metrics = super().loss(batch)
            return loss - 0.01 * torch.where(batch.mask, batch.entropy, 0.0).sum() / batch.num_tokens, metrics

    ctx, rb = _learner(tiny_model_dir, "grpo")
    ctx.method = Bonus(**ctx.cfg.method.params)
    seen = _spy(ctx, monkeypatch)
    own, _ = _step(ctx, rb)
    assert seen and all(s == {"forward": True, "batch": True} for s in seen)
    ctx, rb = _learner(tiny_model_dir, "grpo", "train.entropy_coef=0.01")
    coef, _ = _step(ctx, rb)
    for n in own:
        torch.testing.assert_close(own[n], coef[n], rtol=1e-5, atol=1e-8, msg=n)


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_entropy_coef_out_of_range_is_refused(value):
    with pytest.raises(UserError, match=r"train.entropy_coef must be >= 0 and finite \(0 = off\)"):
        load_config(overrides=[f"train.entropy_coef={value}"])
    assert load_config(overrides=["train.entropy_coef=0.01"]).train.entropy_coef == 0.01
