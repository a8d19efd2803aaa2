"""The contract every registered method must meet (thinkrl/methods/__init__.py; docs/methods.md, tokenbatch). Adding a file to
thinkrl/methods/ is safe because this test runs over all of them. Each method's own hand-worked cases are
tests/methods/test_<name>.py."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from thinkrl.batch import TokenBatch
from thinkrl.config.load import to_dict
from thinkrl.errors import UserError
from thinkrl.methods import available_methods, get_method, load_plugins, method_class
from thinkrl.settings import load_config, resolve

EXAMPLES = Path(__file__).parent.parent / "examples" / "custom_method"
CONFIGS = Path(__file__).parent.parent / "configs"
load_plugins(EXAMPLES)  # example plugins meet the contract too
# examples/custom_method/vanilla_pg.py shows the plugin API on plain REINFORCE, which has no paper to cite
NO_PAPER = {"vanilla_pg"}

B, T, K = 4, 5, 3
MASK = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]]).bool()


def make_batch(theta: torch.Tensor, topk_theta: torch.Tensor, junk: float | None = None, on_policy: bool | str = False, seed: int = 0):
    """A batch whose logp is `theta` (a leaf with grad). With `junk`, masked positions of every field hold it.

    on_policy=True: logp == old_logp == behav_logp, and the proposal fields agree: pi_old's top-K log-probs are
    pi_theta's and the sampled token is the proposal's top-1 id (an id outside V_K in the last column), so a
    method that treats tokens in V_K differently (sis accepts them) is exercised there too.
    on_policy="writer": each token is on-policy only for the policy that wrote it: behav_logp == logp on the
    prefix_mask tokens (a historical checkpoint pi_h wrote them) and old_logp == logp on the others, the other
    log-prob being 0.5-ish off (pi_old on the prefix; a sampler with a precision gap elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    logp = theta
    old = theta.detach() if on_policy else (theta.detach() + 0.3 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
    behav = old.clone() if on_policy else (old + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])[:, None].expand(B, T).clone()
    fields = dict(
        old_logp=old,
        behav_logp=behav,
        advantages=adv,
        token_ids=torch.randint(0, 50, (B, T), generator=g),
        prefix_mask=torch.zeros(B, T, dtype=torch.bool).index_fill(1, torch.tensor([0]), True),
        entropy=torch.rand(B, T, generator=g) * 2,
        old_entropy=torch.rand(B, T, generator=g) * 2,
        ref_logp=(old + 0.1 * torch.randn(B, T, generator=g)).clamp(max=-0.01),
        topk_ids=torch.randint(0, 50, (B, T, K), generator=g),
        topk_old_logp=torch.log_softmax(torch.randn(B, T, K, generator=g), -1),
        token_js=torch.rand(B, T, generator=g) * 0.69,
    )
    if on_policy:
        fields["topk_old_logp"] = topk_theta.detach()
        fields["token_ids"] = torch.where(torch.arange(T) < T - 1, fields["topk_ids"][..., 0], 99)  # (B, T)
    if on_policy == "writer":
        prefix, off = fields["prefix_mask"], (theta.detach() + 0.5 * torch.randn(B, T, generator=g)).clamp(max=-0.01)
        fields["old_logp"] = torch.where(prefix, off, theta.detach())
        fields["behav_logp"] = torch.where(prefix, theta.detach(), off)
    topk_logp = topk_theta
    if junk is not None:
        pad = ~MASK
        logp = torch.where(pad, torch.full_like(theta, junk), theta)
        topk_logp = torch.where(pad[..., None], torch.full_like(topk_theta, junk), topk_theta)
        for k in ("old_logp", "behav_logp", "advantages", "entropy", "old_entropy", "ref_logp", "token_js", "topk_old_logp"):
            v = fields[k]
            fields[k] = torch.where(pad if v.dim() == 2 else pad[..., None], torch.full_like(v, junk), v)
    return TokenBatch(logp=logp, mask=MASK, topk_logp=topk_logp, generator=torch.Generator().manual_seed(seed), **fields)


def leaves(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    theta = (-torch.rand(B, T, generator=g) * 3 - 0.05).requires_grad_()
    topk = torch.log_softmax(torch.randn(B, T, K, generator=g), -1).requires_grad_()
    return theta, topk


def loss_and_grad(method, **kw):
    theta, topk = leaves()
    loss, metrics = method.loss(make_batch(theta, topk, **kw))
    loss.backward()
    return loss.detach(), theta.grad.clone(), metrics


@pytest.fixture(params=available_methods())
def method_name(request):
    return request.param


def test_finite_scalar_and_detached_metrics(method_name):
    loss, grad, metrics = loss_and_grad(get_method(method_name))
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert torch.isfinite(grad).all()
    for k, v in metrics.items():
        assert isinstance(v, torch.Tensor) and not v.requires_grad, k
        assert torch.isfinite(v).all(), k


def test_rollout_correction_weights_scale_every_token(method_name):
    """is_weights (TIS/MIS) multiplies the per-token loss of any method, so all-2 weights double it."""
    theta, topk = leaves()
    plain = make_batch(theta, topk)
    doubled = make_batch(theta, topk)
    doubled.is_weights = torch.full((B, T), 2.0) * MASK
    loss, _ = get_method(method_name).loss(plain)
    loss2, _ = get_method(method_name).loss(doubled)
    assert torch.allclose(loss2, 2 * loss, atol=1e-6)


@pytest.mark.parametrize("junk", [1e9, -1e9, float("nan")])
def test_masked_positions_change_neither_loss_nor_gradient(method_name, junk):
    clean_loss, clean_grad, _ = loss_and_grad(get_method(method_name))
    junk_loss, junk_grad, _ = loss_and_grad(get_method(method_name), junk=junk)
    assert torch.equal(clean_loss, junk_loss)
    assert torch.equal(clean_grad, junk_grad)


def test_micro_batches_with_global_counts_reproduce_full_batch(method_name):
    m = get_method(method_name)
    if getattr(type(m), "batch_statistics", False):
        pytest.skip(f"{method_name} uses statistics of the whole batch it sees; the trainer passes the mini-batch in one call")
    full_loss, full_grad, _ = loss_and_grad(m)
    theta, topk = leaves()
    total = 0.0
    for part in make_batch(theta, topk).split([1, 3]):  # global num_tokens / num_seqs are kept
        loss, _ = get_method(method_name).loss(part)
        loss.backward(retain_graph=True)  # the parts share the batch's graph
        total = total + loss.detach()
    assert torch.allclose(total, full_loss, atol=1e-6)
    assert torch.allclose(theta.grad, full_grad, atol=1e-6)


def test_on_policy_gradient_is_reinforce(method_name):
    """At logp == old_logp == behav_logp the gradient equals that of aggregate(-A * logp)."""
    m = get_method(method_name)
    if not m.reinforce_on_policy:
        pytest.skip(f"{method_name} selects or reweights tokens on-policy by design")
    if {"token_ids", "topk_ids"} <= m.requires:  # the batch must reach the top-K branch (sis: accepted tokens)
        batch = make_batch(*leaves(), on_policy=True)
        assert batch.token_ids is not None and batch.topk_ids is not None
        in_topk = (batch.token_ids[..., None] == batch.topk_ids).any(-1)  # (B, T)
        assert 0.5 < in_topk[MASK].float().mean() < 1
    _assert_reinforce(m, True)


def test_on_policy_for_the_writer_of_each_token_is_reinforce(method_name):
    """A method that requires prefix_mask ratios each token against the policy that wrote it: pi_h (behav_logp) on
    prefix tokens, pi_old elsewhere. With every writer equal to pi_theta, and the other anchor off, the gradient is
    REINFORCE's (a prefix token against pi_old, or a continuation token against mu, would not give it)."""
    m = get_method(method_name)
    if "prefix_mask" not in m.requires or not m.reinforce_on_policy:
        pytest.skip(f"{method_name} does not ratio prefix tokens against their writer")
    _assert_reinforce(m, "writer")


def _assert_reinforce(m, on_policy: bool | str) -> None:
    from thinkrl.methods._common import aggregate

    _, grad, _ = loss_and_grad(m, on_policy=on_policy)
    theta, _ = leaves()
    adv = make_batch(theta, leaves()[1]).advantages
    ref = aggregate(-adv * theta, MASK, m.cfg.aggregation, int(MASK.sum()), B, getattr(m.cfg, "norm_length", 0) or T)
    ref.backward()
    assert torch.allclose(grad, theta.grad, atol=1e-6)


def test_help_names_the_paper_and_documents_every_field(method_name):
    """`thinkrl methods NAME` prints help(): the paper by its arXiv id, then every Config field with a doc line."""
    cls = method_class(method_name)
    text = cls.help()
    assert cls.summary()
    if method_name not in NO_PAPER:
        assert re.search(r"arXiv \d{4}\.\d{4,5}", text), f"{method_name}: help names no paper by its arXiv id"
    for f in dataclasses.fields(cls.Config):
        # "  name = default    doc"
        assert re.search(rf"^  {re.escape(f.name)} = .*? {{4}}\S", text, re.M), f"{method_name}: field {f.name} has no doc line"


def test_config_file_resolves(method_name):
    path = CONFIGS / f"{method_name}.yaml"
    if not path.exists():
        pytest.skip(f"no configs/{method_name}.yaml (plugins ship none)")
    assert resolve(load_config(path)).method.name == method_name


def test_negative_clip_is_rejected(method_name):
    fields = {f.name for f in dataclasses.fields(method_class(method_name).Config)}
    if "clip_low" not in fields:
        pytest.skip(f"{method_name} has no clip_low")
    for field in ("clip_low", "clip_high") if "clip_high" in fields else ("clip_low",):
        # cispo checks the pair: "clip_low and clip_high must be >= 0, got -0.1 and 0.2"
        with pytest.raises(UserError, match=rf"({field}|clip_low and clip_high) must be >= 0, got .*-0\.1"):
            get_method(method_name, **{field: -0.1})


def test_config_file_is_the_recipe(method_name):
    """configs/NAME.yaml is a readable example of exactly what `--method NAME` applies."""
    path = CONFIGS / f"{method_name}.yaml"
    if not path.exists():
        pytest.skip(f"no configs/{method_name}.yaml (plugins ship none)")
    from thinkrl.config.files import read_yaml

    written = {key: value for key, value, _ in read_yaml(path) if key != "method.name"}
    assert written == method_class(method_name).recipe


def test_method_name_applies_the_recipe_beneath_the_users_settings(method_name):
    """defaults < recipe < file < -o; --no-recipe (recipe=False) leaves it out; config.yaml shows it."""
    cls = method_class(method_name)
    with_recipe = load_config(**{"method.name": method_name})
    without = load_config(recipe=False, **{"method.name": method_name})
    for key, value in cls.recipe.items():
        section, _, field = key.rpartition(".")
        got = with_recipe.method.params[field] if section == "method" else getattr(_section(with_recipe, section), field)
        assert got == value, key
    assert not without.method.recipe and (not cls.recipe or to_dict(with_recipe) != to_dict(without))
    if "train.mini_batches" in cls.recipe:  # -o wins over the recipe
        assert load_config(overrides=["train.mini_batches=2"], **{"method.name": method_name}).train.mini_batches == 2


def _section(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg
