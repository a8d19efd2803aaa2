import pytest
import torch

from thinkrl.learner.advantages import compute_advantages


def test_grpo_hand_values():
    # docs/methods.md, advantages: rewards [1,0,0,1]: mean 0.5, sample std sqrt(1/3) = 0.57735 -> +-0.5/0.57735 = +-0.866025
    adv, stats = compute_advantages(torch.tensor([1.0, 0, 0, 1]), 4, "grpo", eps=1e-6)
    assert torch.allclose(adv, torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-5)
    assert stats["frac_reward_zero_std"] == 0.0


def test_no_std_is_dr_grpo():
    adv, _ = compute_advantages(torch.tensor([1.0, 0, 0, 1]), 4, "no_std")
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_rloo_leaves_one_out():
    # A_0 = 1 - mean(0, 0, 1) = 2/3
    adv, _ = compute_advantages(torch.tensor([1.0, 0, 0, 1]), 4, "rloo")
    assert torch.allclose(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


@pytest.mark.parametrize("estimator", ["grpo", "no_std", "rloo"])
def test_groups_sum_to_zero_and_equal_groups_give_exact_zeros(estimator):
    rewards = torch.tensor([1.0, 0, 1, 1, 0.0, 0, 0, 0, 1, 1, 1, 1])  # second and third group carry no signal
    adv, stats = compute_advantages(rewards, 4, estimator)
    groups = adv.view(3, 4)
    assert torch.allclose(groups.sum(-1), torch.zeros(3), atol=1e-6)
    assert groups[1:].eq(0).all() and not torch.isnan(adv).any()
    assert stats["frac_reward_zero_std"] == pytest.approx(2 / 3)


def test_group_of_one_and_bad_sizes():
    adv, _ = compute_advantages(torch.tensor([1.0, 0.0]), 1, "grpo")
    assert adv.tolist() == [1.0, 0.0]  # verl's rule: mean 0, std 1
    with pytest.raises(ValueError, match="groups of 3"):
        compute_advantages(torch.ones(4), 3)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages(torch.ones(4), 2, "nope")
