"""Every family thinkrl expects to train, end to end on a CPU: two LoRA steps and an eval of the run, on each
engine a CPU has (lean, transformers), with the path that decoded named in the startup output.

The tiny random models come from tests/families.py; what each family changes (biases, q/k norms, llama3
rope scaling, sliding windows shorter than the prompt, soft-capping, fused projections) reaches sampling,
the training forward, the checkpoint and eval's merge. Slow: fourteen runs and evals.
"""

from __future__ import annotations

import math
import re

import pytest
from families import FAMILIES, build_family
from test_cli_e2e import tiny_args
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.errors import UserError
from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.slow

DECODERS = {"lean": "fused decoder", "transformers": "transformers' paged continuous batching"}  # lean_family.py covers all seven
BUDGET = ["-o", "rollout.max_new_tokens=6", "-o", "rollout.group_size=2", "-o", "train.micro_batch_size=4"]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """Each family's model directory, built on first use and shared by the module's tests."""
    built: dict = {}

    def get(name: str):
        if name not in built:
            built[name] = build_family(name, tmp_path_factory.mktemp(f"family-{name}"))
        return built[name]

    return get


def sampling_line(output: str, engine: str, setting: str) -> str:
    """The decoder the run's "sampling:" line names, after checking the line names `engine` set by `setting`."""
    found = re.findall(r"^sampling: engine (\w+) \(set by ([^)]+)\): (.+)$", output, re.M)
    assert len(found) == 1, output
    named, said, decoder = found[0]
    assert (named, said) == (engine, setting), found
    assert decoder == DECODERS[engine], decoder
    return decoder


def cli(args: list[str]):
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("engine", ["lean", "transformers"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_and_evaluates(family, engine, family_dirs, tmp_path):
    out = tmp_path / "run"
    trained = cli(tiny_args(family_dirs(family), out, 2, "-o", f"rollout.engine={engine}", *BUDGET))
    if family == "gemma2" and engine == "transformers":
        if trained.exit_code == 0:
            pytest.skip("the transformers engine does not refuse Gemma-2 yet (its paged attention has no soft-capping)")
        assert isinstance(trained.exception, UserError), trained.output
        assert "soft-capping" in str(trained.exception) and not out.exists()
        return
    assert trained.exit_code == 0, (trained.output, trained.exception)
    print(f"{family} on {engine}: train: {sampling_line(trained.output, engine, 'rollout.engine')}")
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics), metrics
    assert all(m["mismatch/abs_log_ratio"] < 1e-3 for m in metrics), metrics  # the sampler's log-probs are the trainer's
    assert metrics[0]["mismatch/agreement_gap"] < 1e-3 and "sampler and trainer disagree" not in trained.output  # checked, passed (float32)
    evaluated = cli(["eval", "--model", str(out), "--limit", "2", "--max-new-tokens", "4", "--engine", engine])
    assert evaluated.exit_code == 0, (evaluated.output, evaluated.exception)
    print(f"{family} on {engine}: eval: {sampling_line(evaluated.output, engine, '--engine')}")
    assert len(read_jsonl(out / "eval" / "step-2" / "arith" / "samples.jsonl")) == 2
