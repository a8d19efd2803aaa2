"""ICT against the hand-worked sanity cases in docs/methods.md, ict (js_divergence is in test_common.py)."""

import pytest
import torch
from batches import CONFIGS, random_topk_batch

from thinkrl.batch import TokenBatch
from thinkrl.errors import UserError
from thinkrl.methods import get_method, method_class
from thinkrl.methods.ict import select_tokens
from thinkrl.settings import load_config, resolve_with_method

# Hand example (pad = padding). Token-id scores = mean JS over occurrences:
#   id 9: 0.40;  id 5: (0.60 + 0.00) / 2 = 0.30;  id 7: (0.10 + 0.30) / 2 = 0.20;  id 8: (0.25 + 0.05) / 2 = 0.15
IDS = torch.tensor([[5, 7, 5, 9], [7, 8, 8, 0]])
JS = torch.tensor([[0.60, 0.10, 0.00, 0.40], [0.30, 0.25, 0.05, 0.0]])
HAND_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool()


def hand_batch():
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    batch = TokenBatch(
        logp=logp,
        old_logp=logp.detach(),
        behav_logp=logp.detach(),
        advantages=torch.tensor([1.0, -1.0]),
        mask=HAND_MASK,
        token_ids=IDS,
        token_js=JS,
    )
    return logp, batch


def test_ict_token_id_and_position_select_differently():
    # token_id, frac 0.5: 4 ids -> k = 2 -> ids {9, 5} -> positions (0,0), (0,2), (0,3); (0,2) has JS 0 but
    # its id is kept. position, frac 0.4: 7 valid -> k = ceil(2.8) = 3 -> JS 0.60, 0.40, 0.30 -> (0,0), (0,3), (1,0)
    keep, units, kept = select_tokens(JS, HAND_MASK, 0.5, "token_id", IDS)
    assert keep.tolist() == [[True, False, True, True], [False, False, False, False]] and (units, kept) == (4, 2)
    keep, units, kept = select_tokens(JS, HAND_MASK, 0.4, "position")
    assert keep.tolist() == [[True, False, False, True], [True, False, False, False]] and (units, kept) == (7, 3)
    # the loss: r = 1, A = [+1, -1], token-mean over all 7 valid tokens. token_id: -(1 + 1 + 1) / 7;
    # position: (-1 - 1 + 1) / 7. Gradient -A / 7 on selected tokens, exactly 0 elsewhere.
    for unit, frac, value in (("token_id", 0.5, -3 / 7), ("position", 0.4, -1 / 7)):
        logp, batch = hand_batch()
        loss, metrics = get_method("ict", unit=unit, frac=frac).loss(batch)
        loss.backward()
        keep = select_tokens(JS, HAND_MASK, frac, unit, IDS)[0]
        assert loss.item() == pytest.approx(value)
        expected = torch.where(keep, -torch.tensor([1.0, -1.0])[:, None] / 7, 0.0)
        assert torch.allclose(logp.grad, expected)
        assert metrics["select/frac"].item() == pytest.approx(3 / 7)


def test_ict_ties_at_the_threshold_are_all_kept_whatever_the_order():
    # positions: JS [0.5, 0.3, 0.3, 0.1], frac 0.5 -> k = 2, 2nd best 0.3 -> both 0.3 kept (3 of 4)
    js, mask = torch.tensor([[0.5, 0.3, 0.3, 0.1]]), torch.ones(1, 4, dtype=torch.bool)
    assert select_tokens(js, mask, 0.5, "position")[0].tolist() == [[True, True, True, False]]
    # token ids: ids 3 and 4 tie at 0.3 -> both kept; the same selection with the rows swapped
    ids = torch.tensor([[1, 3], [4, 2]])
    js = torch.tensor([[0.5, 0.3], [0.3, 0.1]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    keep = select_tokens(js, mask, 0.5, "token_id", ids)[0]
    assert keep.tolist() == [[True, True], [True, False]]
    assert torch.equal(select_tokens(js.flip(0), mask, 0.5, "token_id", ids.flip(0))[0], keep.flip(0))
    # ceil after rounding: 0.1 x 30 = 3.0000000000000004 -> 3 positions, not 4
    js = torch.linspace(0.01, 0.3, 30)[None]
    assert select_tokens(js, torch.ones(1, 30, dtype=torch.bool), 0.1, "position")[0].sum().item() == 3


@pytest.mark.parametrize("unit", ["token_id", "position"])
def test_ict_fraction_one_is_grpo_token_mean(unit):
    results = []
    for name, overrides in (("ict", {"frac": 1.0, "unit": unit}), ("grpo", {"aggregation": "token-mean"})):
        logp, batch, _, mask = random_topk_batch(off_policy=True)
        batch.token_js = torch.where(mask, torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)), 0.0)
        loss, _ = get_method(name, **overrides).loss(batch)
        loss.backward()
        results.append((loss.detach(), logp.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_ict_config_and_properties():
    m = get_method("ict", reference="response")
    assert m.js_reference == "response" and type(m).batch_statistics and not m.reinforce_on_policy
    assert m.requires == {"token_js", "token_ids"}
    assert get_method("ict", unit="position").requires == {"token_js"}
    # a negative clip_low: test_method_contract.py::test_negative_clip_is_rejected
    for overrides, message in (
        ({"frac": 0.0}, r"frac must be in \(0, 1\].*got 0.0"),
        ({"frac": 1.5}, "frac must be in"),
        ({"norm_length": -1}, "norm_length must be >= 0"),
        ({"unit": "word"}, "method.unit: 'word' is not one of"),
        ({"reference": "model"}, "method.reference: 'model' is not one of"),
    ):
        with pytest.raises(UserError, match=message):
            get_method("ict", **overrides)


def test_ict_config_file_and_help():
    # resolving to method.name ict and documenting every field: test_method_contract.py
    assert resolve_with_method(load_config(CONFIGS / "ict.yaml"))[1].cfg.norm_length == 48
    assert "arXiv 2606.19771" in method_class("ict").help()
