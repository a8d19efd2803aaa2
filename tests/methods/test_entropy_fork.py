"""20-Entropy (the 80/20 rule) against the hand-worked cases in docs/methods.md, entropy_fork."""

import pytest
import torch
from batches import grad_of, probs_batch, random_batch

from thinkrl.errors import UserError
from thinkrl.methods import get_method

ENTROPIES = [0.05, 0.9, 0.1, 2.0, 0.3, 0.02, 1.5, 0.2, 0.01, 0.4]


def test_entropy_fork_keeps_the_top_20_percent():
    # sorted: 0.01 0.02 0.05 0.1 0.2 0.3 0.4 0.9 1.5 2.0; rank 0.8 * 9 = 7.2 -> 0.9 + 0.2 (1.5 - 0.9) = 1.02
    # kept: H = 2.0 (index 3) and H = 1.5 (index 6). On-policy r = 1, A = +1: l = -1 on those two tokens,
    # token-mean over all 10 tokens -> loss -0.2, gradient -1/10 there and 0 elsewhere
    logp, batch = probs_batch([[0.5] * 10], [[0.5] * 10], [1.0], entropy=[ENTROPIES])
    m = get_method("entropy_fork")
    assert m.requires == {"entropy"}
    loss, grad, metrics = grad_of(m, logp, batch)
    assert metrics["entropy/threshold"].item() == pytest.approx(1.02, abs=1e-6)
    assert metrics["select/frac"].item() == pytest.approx(0.2)
    assert loss.item() == pytest.approx(-0.2)
    expected = torch.zeros(1, 10)
    expected[0, 3] = expected[0, 6] = -0.1
    assert torch.allclose(grad, expected)


def test_entropy_fork_quantile_ignores_padding():
    # the same ten tokens spread over two rows with padding in between: same threshold, same two tokens
    ent = [ENTROPIES[:6] + [9.0, 9.0], ENTROPIES[6:] + [9.0] * 4]
    mask = [[1] * 6 + [0, 0], [1] * 4 + [0] * 4]
    logp, batch = probs_batch([[0.5] * 8] * 2, [[0.5] * 8] * 2, [1.0, 1.0], mask=mask, entropy=ent)
    _, grad, metrics = grad_of(get_method("entropy_fork"), logp, batch)
    assert metrics["entropy/threshold"].item() == pytest.approx(1.02, abs=1e-6)
    assert (grad != 0).nonzero().tolist() == [[0, 3], [1, 0]]


def test_entropy_fork_with_rho_1_is_dapo():
    logp, batch = random_batch(entropy=True)
    loss, grad, _ = grad_of(get_method("entropy_fork", rho=1.0), logp, batch)
    logp2, batch2 = random_batch(entropy=True)
    dapo_loss, dapo_grad, _ = grad_of(get_method("grpo", clip_high=0.28, aggregation="token-mean"), logp2, batch2)
    assert torch.equal(loss, dapo_loss) and torch.equal(grad, dapo_grad)


def test_entropy_fork_config_is_validated():
    with pytest.raises(UserError, match="rho must be in"):
        get_method("entropy_fork", rho=0.0)
