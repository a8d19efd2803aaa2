"""STAPO against the hand-worked cases in docs/methods.md, stapo."""

import pytest
import torch
from batches import grad_of, probs_batch, random_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method


def test_stapo_silences_positive_low_prob_low_entropy_token_only():
    # two rows of 12 tokens, on-policy (r = 1). Token 0 of each row: pi = 0.005 < tau_p = 0.01, H = 0.01.
    # 24 entropies sorted: 0.01 0.01 1.0 1.0 ...; rank 0.05 * 23 = 1.15 -> tau_h = 0.01 + 0.15 (1.0 - 0.01) = 0.1585
    # row 0 has A = +1 -> its token 0 is silenced; row 1 has A = -1 -> kept.
    # loss = (11 (-1) + 12 (+1)) / (24 - 1) = 1/23; gradient -A r / 23: row 0 -1/23 (token 0: 0), row 1 +1/23
    pi = [[0.005] + [0.5] * 11] * 2
    ent = [[0.01] + [1.0 + 0.1 * k for k in range(11)]] * 2
    logp, batch = probs_batch(pi, pi, [1.0, -1.0], entropy=ent, old=pi)
    m = get_method("stapo")
    assert m.requires == {"entropy"}
    loss, grad, metrics = grad_of(m, logp, batch)
    assert metrics["entropy/threshold"].item() == pytest.approx(0.1585, abs=1e-6)
    assert metrics["silenced/frac"].item() == pytest.approx(1 / 24)
    assert loss.item() == pytest.approx(1 / 23)
    expected = torch.tensor([[0.0] + [-1 / 23] * 11, [1 / 23] * 12])
    assert torch.allclose(grad, expected)


def test_stapo_needs_all_three_criteria():
    # same rows, but token 0 of row 0 has pi = 0.05 >= tau_p: nothing silenced -> token-mean over 24
    pi = [[0.05] + [0.5] * 11, [0.005] + [0.5] * 11]
    ent = [[0.01] + [1.0 + 0.1 * k for k in range(11)]] * 2
    logp, batch = probs_batch(pi, pi, [1.0, -1.0], entropy=ent, old=pi)
    loss, _, metrics = grad_of(get_method("stapo"), logp, batch)
    assert metrics["silenced/frac"].item() == 0.0
    assert loss.item() == pytest.approx(0.0, abs=1e-7)  # (12 (-1) + 12 (+1)) / 24
    # an entropy at or above tau_h protects it too: row 0 token 0 with H = 1.5 (pi = 0.005, A = +1).
    # sorted: 0.01 1.0 1.0 1.1 ...; rank 1.15 -> tau_h = 1.0 + 0.15 (1.0 - 1.0) = 1.0 <= 1.5 -> not silenced
    pi = [[0.005] + [0.5] * 11] * 2
    ent = [[1.5] + [1.0 + 0.1 * k for k in range(11)], [0.01] + [1.0 + 0.1 * k for k in range(11)]]
    logp, batch = probs_batch(pi, pi, [1.0, -1.0], entropy=ent, old=pi)
    _, _, metrics = grad_of(get_method("stapo"), logp, batch)
    assert metrics["silenced/frac"].item() == 0.0
    assert metrics["entropy/threshold"].item() == pytest.approx(1.0, abs=1e-6)


def test_stapo_without_spurious_tokens_is_grpo_token_mean():
    logp, batch = random_batch(entropy=True)  # pi >= 0.047 > tau_p: no token can be silenced
    loss, grad, metrics = grad_of(get_method("stapo"), logp, batch)
    assert metrics["silenced/frac"].item() == 0.0
    logp2, batch2 = random_batch(entropy=True)
    ref_loss, ref_grad, _ = grad_of(get_method("grpo", aggregation="token-mean"), logp2, batch2)
    assert torch.allclose(loss, ref_loss, atol=1e-7) and torch.allclose(grad, ref_grad, atol=1e-7)


def test_stapo_config_is_validated():
    with pytest.raises(UserError, match="tau_p must be in"):
        get_method("stapo", tau_p=0.0)
    with pytest.raises(UserError, match="entropy_quantile must be in"):
        get_method("stapo", entropy_quantile=1.5)
