"""Dr.GRPO against the hand-worked sanity cases in docs/methods.md, dr_grpo."""

import math

import pytest
import torch
from batches import CONFIGS, ratio_batch

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.settings import load_config, resolve_with_method


def test_dr_grpo_aggregation_worked_example():
    # A = -1 and r >= 1: l = max(r, clip(r, 0.8, 1.2)) = r, so ratios [1,2] and [3,4,5,6] give exactly the
    # per-token losses of docs/methods.md, aggregation. seq-mean-token-sum-norm, N = 2, L = 8: 21 / 16 = 1.3125.
    # d l / d logp = r (unclipped branch), so each token's gradient is r / 16.
    r = [[1.0, 2.0, 1.0, 1.0], [3.0, 4.0, 5.0, 6.0]]
    logp, batch = ratio_batch([[math.log(v) for v in row] for row in r], [-1.0, -1.0], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    loss, _ = get_method("dr_grpo", norm_length=8).loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(1.3125)
    expected = torch.tensor([[1 / 16, 2 / 16, 0, 0], [3 / 16, 4 / 16, 5 / 16, 6 / 16]])
    assert torch.allclose(logp.grad, expected)


def test_dr_grpo_norm_length_is_the_budget_in_the_trainer_and_padded_length_alone():
    # configs/dr_grpo.yaml resolves norm_length 0 to rollout.max_new_tokens = 48 for the run's method; its
    # config keeps 0, so a resume with another budget follows it (tests/test_config.py)
    cfg, method = resolve_with_method(load_config(CONFIGS / "dr_grpo.yaml"))
    assert method.cfg.norm_length == 48 and cfg.method.params["norm_length"] == 0
    # used directly with norm_length 0: L = padded T = 4, so the same batch gives 21 / (2 * 4) = 2.625
    r = [[1.0, 2.0, 1.0, 1.0], [3.0, 4.0, 5.0, 6.0]]
    _, batch = ratio_batch([[math.log(v) for v in row] for row in r], [-1.0, -1.0], mask=[[1, 1, 0, 0], [1, 1, 1, 1]])
    assert get_method("dr_grpo").loss(batch)[0].item() == pytest.approx(2.625)


def test_dr_grpo_advantage_estimator_is_no_std():
    assert method_class("dr_grpo").advantage == "no_std"


def test_dr_grpo_help_names_its_paper():
    assert "arXiv 2503.20783" in method_class("dr_grpo").help()


def test_dr_grpo_config_is_validated():
    # a negative clip_low: test_method_contract.py::test_negative_clip_is_rejected
    with pytest.raises(UserError, match="norm_length must be >= 0"):
        get_method("dr_grpo", norm_length=-1)
    with pytest.raises(UserError, match="method.clip_hihg.*did you mean clip_high"):
        get_method("dr_grpo", clip_hihg=0.3)


@pytest.mark.parametrize(
    "weights, want_loss, want_grad",
    [(None, -0.4962820, [-0.2662180, -0.25]), ([2.0, 0.5], -0.6212820, [-0.5162180, -0.125])],
)
def test_dr_grpo_kl_is_added_after_the_correction_weights(weights, want_loss, want_grad):
    # grpo's beta KL, inherited (docs/methods.md, grpo): pi = pi_old = 0.5 (r = 1), A = +1, beta 0.1, L = 4.
    # Token 0 has log(ref / pi) = 0.5: 0.1 k3 = 0.1 (e^0.5 - 1.5) = 0.0148721, gradient 0.1 (1 - e^0.5) = -0.0648721.
    # No correction: loss (-1 - 1 + 0.0148721) / 4, grads [(-1 - 0.0648721) / 4, -1 / 4].
    # TIS weights [2, 0.5] scale -A r only: loss (-2 - 0.5 + 0.0148721) / 4, grads [(-2 - 0.0648721) / 4, -0.5 / 4]
    logp = torch.full((1, 2), math.log(0.5), requires_grad=True)
    batch = TokenBatch(
        logp=logp,
        old_logp=logp.detach(),
        behav_logp=logp.detach(),
        advantages=torch.ones(1),
        mask=torch.ones(1, 2),
        ref_logp=torch.tensor([[math.log(0.5) + 0.5, math.log(0.5)]]),
        is_weights=None if weights is None else torch.tensor([weights]),
    )
    loss, _ = get_method("dr_grpo", beta=0.1, norm_length=4).loss(batch)
    loss.backward()
    assert loss.item() == pytest.approx(want_loss, abs=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([want_grad]), atol=1e-6)
