"""CTPO against the hand-worked sanity cases in docs/methods.md, ctpo: bounds, cumulative ratio, gradient, reduction to grpo."""

import math

import pytest
import torch
from batches import CONFIGS, grad_of, random_batch, ratio_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods.ctpo import Config as CTPOConfig
from thinkrl.methods.ctpo import cumulative_log_ratio, log_bounds
from thinkrl.settings import load_config, resolve


@pytest.mark.parametrize(
    "n, low, high",
    [
        (1, 0.9753, 1.0513),  # sqrt(1) = 1: [e^-0.025, e^0.05]
        (100, 0.7788, 1.6487),  # sqrt(100) = 10: [e^-0.25, e^0.5]
        (1000, 0.4536, 4.8605),  # sqrt(1000) = 31.623: [e^-0.79057, e^1.58114]
        (8000, 0.1069, 87.54),  # sqrt(8000) = 89.443: [e^-2.23607, e^4.47214]
    ],
)
def test_ctpo_ratio_window_grows_with_sqrt_position(n, low, high):
    lo, hi, dual = log_bounds(torch.tensor([[float(n)]]), CTPOConfig())
    assert math.exp(lo.item()) == pytest.approx(low, abs=1e-4)
    assert math.exp(hi.item()) == pytest.approx(high, rel=1e-4)
    assert torch.equal(dual, hi)  # eps_c = eps_hi: the dual-clip threshold is the upper bound


def test_ctpo_uniform_and_ratio_bounds():
    n = torch.tensor([[1.0, 100.0, 8000.0]])
    # p = 0: n^0 = 1, the t = 1 window at every position
    lo, hi, _ = log_bounds(n, CTPOConfig(p=0.0))
    assert torch.allclose(hi, torch.full((1, 3), 0.05)) and torch.allclose(lo, torch.full((1, 3), -0.025))
    # bounds=ratio: [0.8, 1.2] and dual clip 3 everywhere
    lo, hi, dual = log_bounds(n, CTPOConfig(bounds="ratio"))
    assert torch.allclose(lo.exp(), torch.full((1, 3), 0.8)) and torch.allclose(hi.exp(), torch.full((1, 3), 1.2))
    assert torch.allclose(dual.exp(), torch.full((1, 3), 3.0))
    # geomean defaults to p = -0.5: the window narrows like 1/sqrt(n): 0.05 / 10 = 0.005 at n = 100
    _, hi, _ = log_bounds(n, CTPOConfig(variant="geomean"))
    assert torch.allclose(hi, torch.tensor([[0.05, 0.005, 0.05 / math.sqrt(8000)]]))
    assert log_bounds(n, CTPOConfig(eps_c=0.0))[2] is None  # dual clip off


def test_ctpo_cumulative_ratio_worked_example():
    # log-ratios [0.01, 0.02, -0.03, 0.05] -> Lambda = [0.01, 0.03, 0.00, 0.05]
    # R = e^Lambda = [1.010050, 1.030455, 1.0, 1.051271]; upper bounds 0.05 sqrt(n) = [0.05, 0.0707, 0.0866, 0.1]
    # and lower -0.025 sqrt(n) = [-0.025, -0.0354, -0.0433, -0.05] -> nothing clipped.
    # A = +1, token-mean over 4: loss = -(sum R) / 4 = -4.091776 / 4 = -1.022944; d loss / d logp_t = -A R_t / 4
    logp, batch = ratio_batch([[0.01, 0.02, -0.03, 0.05]], [1.0])
    lam, n = cumulative_log_ratio(batch.logp, batch.old_logp, batch.mask, "cumprod")
    assert torch.allclose(lam, torch.tensor([[0.01, 0.03, 0.0, 0.05]]), atol=1e-6)
    assert n.tolist() == [[1, 2, 3, 4]]
    loss, grad, metrics = grad_of(get_method("ctpo"), logp, batch)
    R = torch.tensor([[1.010050, 1.030455, 1.0, 1.051271]])
    assert loss.item() == pytest.approx(-R.sum().item() / 4, abs=1e-6)
    assert torch.allclose(grad, -R / 4, atol=1e-6)
    assert metrics["clip/frac"].item() == 0.0 and metrics["clip/dual_frac"].item() == 0.0
    assert metrics["ratio/log_cum_mean"].item() == pytest.approx(0.09 / 4, abs=1e-6)  # (0.01 + 0.03 + 0 + 0.05) / 4
    assert metrics["ratio/log_cum_abs_max"].item() == pytest.approx(0.05, abs=1e-6)


def test_ctpo_geomean_divides_by_position():
    # Lambda = [0.02, 0.06] -> geomean [0.02 / 1, 0.06 / 2] = [0.02, 0.03]; p = -0.5 upper bounds [0.05, 0.03536]
    # -> unclipped; A = +1: gradient -e^[0.02, 0.03] / 2
    logp, batch = ratio_batch([[0.02, 0.04]], [1.0])
    _, grad, metrics = grad_of(get_method("ctpo", variant="geomean"), logp, batch)
    assert metrics["clip/frac"].item() == 0.0
    assert torch.allclose(grad, -torch.tensor([[math.exp(0.02), math.exp(0.03)]]) / 2, atol=1e-6)


def test_ctpo_single_token_outside_the_window_has_zero_gradient():
    # t = 1, log-ratio 0.06 > 0.05, A = +1: l = max(-e^0.06, -e^0.05) = -e^0.05 = -1.051271, clipped -> gradient 0
    logp, batch = ratio_batch([[0.06]], [1.0])
    loss, grad, metrics = grad_of(get_method("ctpo"), logp, batch)
    assert loss.item() == pytest.approx(-math.exp(0.05), abs=1e-6)
    assert grad.item() == 0.0
    assert metrics["clip/high_frac"].item() == 1.0
    # same token, A = -1: l = max(e^0.06, e^0.05) = 1.061837 (unclipped), then the dual clip at
    # exp(0.05 * 1) caps it: min(1.061837, 1.051271) = 1.051271 -> gradient 0 again
    logp, batch = ratio_batch([[0.06]], [-1.0])
    loss, grad, metrics = grad_of(get_method("ctpo"), logp, batch)
    assert loss.item() == pytest.approx(math.exp(0.05), abs=1e-6)
    assert grad.item() == 0.0
    assert metrics["clip/dual_frac"].item() == 1.0 and metrics["clip/frac"].item() == 0.0


def test_ctpo_same_prefix_ratio_is_clipped_early_and_kept_late():
    # Lambda = 0.3 reached at t = 4 (bound 0.05 * 2 = 0.1: clipped) and at t = 100 (bound 0.5: kept)
    early = [[0.0, 0.0, 0.0, 0.3]]
    logp, batch = ratio_batch(early, [1.0])
    _, grad, _ = grad_of(get_method("ctpo"), logp, batch)
    assert grad[0, 3].item() == 0.0
    late = [[0.0] * 99 + [0.3]]
    logp, batch = ratio_batch(late, [1.0])
    _, grad, _ = grad_of(get_method("ctpo"), logp, batch)
    assert grad[0, 99].item() == pytest.approx(-math.exp(0.3) / 100, rel=1e-5)  # -A R_t / num_tokens


def test_ctpo_prefix_is_stop_gradient():
    # d l_t / d logp_k = 0 for k != t and -A R_t for k = t (unclipped: A < 0 so the upper bound never
    # applies to the loss, and the dual clip only binds above exp(0.05 sqrt(n)) >= 1.05 > R_t here).
    # Row t of the jacobian comes from one backward with the advantage one-hot at t: loss = A_t l_t / N.
    lr = [0.01, -0.02, 0.015, -0.005, 0.02]
    Lam = torch.tensor(lr).cumsum(0)  # [0.01, -0.01, 0.005, 0.0, 0.02]
    T, A = len(lr), -1.0
    jac = torch.zeros(T, T)
    for t in range(T):
        onehot = [[A if k == t else 0.0 for k in range(T)]]
        logp, batch = ratio_batch([lr], onehot)
        _, grad, metrics = grad_of(get_method("ctpo"), logp, batch)
        jac[t] = grad[0] * T  # undo token-mean's 1 / N
        assert metrics["clip/frac"].item() == 0.0
    assert torch.allclose(jac, torch.diag(-A * Lam.exp()), atol=1e-6)
    # the gradient is not that of the loss value: moving logp_1 moves every Lambda_t, t >= 1, so a finite
    # difference of sum_t l_t in logp_1 is -A sum_t R_t = 5.025 (float64), while autograd gives -A R_1 = 1.01005
    m = get_method("ctpo", aggregation="seq-mean-token-sum")  # one row: loss = sum_t l_t

    def value(shift):
        return m.loss(ratio_batch([[lr[0] + shift] + lr[1:]], [A], dtype=torch.float64)[1])[0].item()

    fd = (value(1e-6) - value(-1e-6)) / 2e-6
    assert fd == pytest.approx(-A * Lam.exp().sum().item(), rel=1e-6)
    logp, batch = ratio_batch([lr], [A])
    _, grad, _ = grad_of(m, logp, batch)
    assert grad[0, 0].item() == pytest.approx(-A * math.exp(0.01), rel=1e-6)


def test_ctpo_masked_tool_tokens_change_neither_lambda_nor_position():
    # two generated tokens with log-ratios [0.03, 0.045] -> Lambda_2 = 0.075 at n = 2: bound 0.05 sqrt(2) = 0.0707
    # -> clipped (A = +1, gradient 0). Inserting two tool tokens (mask 0, with junk ratios the helper must ignore)
    # keeps n = 2 at the second generated token; counted as position 4 the bound would be 0.1 and it would pass.
    plain_logp, plain = ratio_batch([[0.03, 0.045]], [1.0])
    plain_loss, plain_grad, _ = grad_of(get_method("ctpo"), plain_logp, plain)
    assert plain_grad[0, 1].item() == 0.0
    tool_logp, tool = ratio_batch([[0.03, 0.7, -0.4, 0.045]], [1.0], mask=[[1, 0, 0, 1]])
    tool_loss, tool_grad, _ = grad_of(get_method("ctpo"), tool_logp, tool)
    assert torch.equal(tool_loss, plain_loss)
    assert torch.equal(tool_grad[:, [0, 3]], plain_grad) and torch.equal(tool_grad[:, [1, 2]], torch.zeros(1, 2))
    # the helper itself, given unfiltered tensors: masked ratios add 0 and do not advance n
    logp = torch.tensor([[-2.0 + 0.03, 5.0, -7.0, -2.0 + 0.045]])
    lam, n = cumulative_log_ratio(logp, torch.full((1, 4), -2.0), torch.tensor([[True, False, False, True]]), "cumprod")
    assert torch.allclose(lam, torch.tensor([[0.03, 0.0, 0.0, 0.075]]), atol=1e-6)
    assert n.tolist() == [[1, 1, 1, 2]]


@pytest.mark.parametrize("overrides", [{}, {"p": 0.0}, {"variant": "geomean"}, {"bounds": "ratio"}])
def test_ctpo_with_all_log_ratios_zero_is_grpo(overrides):
    # R_t = 1 inside every window -> l_t = -A, exactly GRPO with token-mean (same loss, same gradient)
    logp, batch = random_batch(on_policy=True)
    loss, grad, metrics = grad_of(get_method("ctpo", **overrides), logp, batch)
    assert metrics["clip/frac"].item() == 0.0
    logp2, batch2 = random_batch(on_policy=True)
    ref_loss, ref_grad, _ = grad_of(get_method("grpo", aggregation="token-mean"), logp2, batch2)
    assert torch.allclose(loss, ref_loss, atol=1e-7) and torch.allclose(grad, ref_grad, atol=1e-7)
    assert loss.item() == pytest.approx(-(batch.advantages * batch.mask).sum().item() / batch.num_tokens, abs=1e-6)


def test_ctpo_ratio_bounds_on_one_token_sequences_are_grpo_with_dual_clip():
    # with T = 1 the prefix product is the token ratio, so bounds=ratio is grpo's clip 0.2 + dual clip 3
    g = torch.Generator().manual_seed(5)
    lr = (torch.randn(8, 1, generator=g) * 0.8).tolist()
    adv = [1.0, -1.0, 0.5, -2.0, 1.5, -0.3, 0.2, -1.0]
    logp, batch = ratio_batch(lr, adv)
    loss, grad, _ = grad_of(get_method("ctpo", bounds="ratio"), logp, batch)
    logp2, batch2 = ratio_batch(lr, adv)
    ref_loss, ref_grad, _ = grad_of(get_method("grpo", dual_clip=3.0, aggregation="token-mean"), logp2, batch2)
    assert torch.allclose(loss, ref_loss, atol=1e-6) and torch.allclose(grad, ref_grad, atol=1e-6)


def test_ctpo_log_cum_is_capped_at_10():
    # Lambda = 15 + 15 = 30 at t = 2 -> log R capped at 10; everything stays finite
    logp, batch = ratio_batch([[15.0, 15.0]], [-1.0])
    loss, grad, metrics = grad_of(get_method("ctpo"), logp, batch)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert metrics["ratio/log_cum_abs_max"].item() == pytest.approx(10.0)


def test_ctpo_config_is_validated():
    assert get_method("ctpo").cfg.p == 0.5 and get_method("ctpo", variant="geomean").cfg.p == -0.5
    with pytest.raises(UserError, match=r"eps_hi must be > 0.*got 0.0"):
        get_method("ctpo", eps_hi=0.0)
    with pytest.raises(UserError, match=r"eps_lo must be > 0.*got -0.1"):
        get_method("ctpo", eps_lo=-0.1)
    with pytest.raises(UserError, match=r"eps_c must be >= 0.*got -1.0"):
        get_method("ctpo", eps_c=-1.0)
    with pytest.raises(UserError, match=r"p must be in \[-1, 1\].*got 3.0"):
        get_method("ctpo", p=3.0)
    with pytest.raises(UserError, match=r"ratio_clip must be in \(0, 1\), got 1.5"):
        get_method("ctpo", ratio_clip=1.5)
    with pytest.raises(UserError, match=r"ratio_dual_clip must be > 1.*got 0.5"):
        get_method("ctpo", ratio_dual_clip=0.5)
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method("ctpo", norm_length=-1)
    with pytest.raises(UserError, match="not one of"):
        get_method("ctpo", variant="prod")


def test_ctpo_config_file_resolves():
    cfg = resolve(load_config(CONFIGS / "ctpo.yaml"))  # resolving to method.name ctpo: test_method_contract.py
    assert cfg.method.params["p"] == 0.5
    assert (cfg.correction.mode, cfg.correction.level, cfg.correction.c_max) == ("tis", "sequence", 5.0)
    assert cfg.train.mini_batches == 4 and cfg.rollout.group_size == 16


def test_ctpo_advantage_estimator_and_help():
    cls = method_class("ctpo")
    assert cls.advantage == "grpo"
    text = cls.help()
    assert "arXiv 2605.07331" in text and "Relative to grpo" in text and "Confidence" in text
