"""Every built-in method trains two steps end to end on the tiny model: the recipe its name applies, the inputs it
declares (entropy, top-K log-probs, a reference, prefixes), its loss and its state through a real loop.

The grader rewards length (tests/helpers.py), so every group has a reward spread and each loss sees non-zero
advantages. The methods whose inputs span the vocabulary also train on the bundled model (test_bundled_slow.py).
"""

from pathlib import Path

import pytest
from test_cli_e2e import invoke, tiny_args

import thinkrl.methods as registry
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.plain


def builtin_methods() -> list[str]:
    """Methods shipped in thinkrl/methods (not plugins another test may have loaded)."""
    here = Path(registry.__file__).parent
    return [n for n in registry.available_methods() if Path(registry.method_source(n)).parent == here]


def test_the_list_is_the_twenty_documented_methods():
    assert len(builtin_methods()) == 20 and {"grpo", "ctpo", "thinking_seeds"} <= set(builtin_methods())


@pytest.mark.parametrize("method", builtin_methods())
def test_every_method_trains_two_steps(method, tiny_model_dir, tmp_path):
    out = tmp_path / method
    invoke(tiny_args(tiny_model_dir, out, 2, "--method", method))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # finite, or (dynamic sampling kept no group) not measured
        empty = m.get("sampling/kept_groups") == 0
        assert m["loss"] == "nan" if empty else (isinstance(m["loss"], float) and abs(m["loss"]) < 1e6), m
        assert empty or (isinstance(m["grad_norm"], float) and 0 <= m["grad_norm"] < 1e6), m
