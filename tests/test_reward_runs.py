"""reward.functions end to end on the tiny model: each function logged as reward/<name>, training on the weighted
sum, the default unchanged, and failing functions stopping or counted on the step line (the functions
themselves and their config: test_rewards.py). The grader, helpers:length_reward, is the `verifier` entry."""

import pytest
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, run_cli
from test_rewards import FAILS

from thinkrl.run.jsonl import read_jsonl

pytestmark = pytest.mark.plain  # reaches the CPU speed-ups: make test-plain reruns it (tests/plain_marks.py)

TIMES = ("time/", "tokens/s", "generate/tokens_per_s")


def test_a_run_logs_each_function_and_trains_on_the_weighted_sum(tiny_model_dir, tmp_path):
    functions = (
        "[{name: correct, function: verifier, weight: 0.5}, {name: distinct, function: helpers:distinct_chars, weight: 2},"
        " {name: short, function: thinkrl.rewards:length_penalty, weight: 0.25, options: {max_chars: 12}}]"
    )
    invoke(tiny_args(tiny_model_dir, tmp_path / "run", 2, "-o", f"reward.functions={functions}"))
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["reward/correct"] == pytest.approx(m["reward/mean"], abs=1e-6)  # the verifier is the accuracy
        weighted = 0.5 * m["reward/correct"] + 2 * m["reward/distinct"] + 0.25 * m["reward/short"]
        assert m["reward/shaped_mean"] == pytest.approx(weighted, abs=1e-5)
        assert 0 < m["reward/distinct"] <= 1 and -1 <= m["reward/short"] < 0 and m["verifier/errors"] == 0
        assert m["reward/shaped_mean"] != pytest.approx(m["reward/mean"])  # not vacuous
    rows = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    assert sum(r["reward"] for r in rows if r["step"] == 1) / 8 == pytest.approx(metrics[0]["reward/shaped_mean"], abs=1e-5)


def test_a_run_without_reward_functions_logs_what_it_always_did(tiny_model_dir, tmp_path):
    """The default logs no new key, and trains exactly as the explicit verifier with a weight-0 user function."""
    invoke(tiny_args(tiny_model_dir, tmp_path / "default", 2))
    zero = "[{name: correct, function: verifier, weight: 1}, {name: zero, function: helpers:distinct_chars, weight: 0}]"
    invoke(tiny_args(tiny_model_dir, tmp_path / "zero", 2, "-o", f"reward.functions={zero}"))
    default, explicit = (read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("default", "zero"))
    new = {"reward/correct", "reward/zero"}  # verifier/errors (the grader's exceptions too) is in both
    for d, e in zip(default, explicit, strict=True):
        assert d["verifier/errors"] == e["verifier/errors"] == 0
        assert not new & set(d) and {k for k in d if k.startswith("reward/")} == {"reward/mean", "reward/std", "reward/shaped_mean"}
        assert set(e) == set(d) | new
        assert {k: v for k, v in d.items() if not k.startswith(TIMES)} == {k: v for k, v in e.items() if k in d and not k.startswith(TIMES)}
        assert d["grad_norm"] > 0  # the runs trained


def test_a_run_whose_reward_function_exits_on_every_text_stops_with_one_line(tiny_model_dir, tmp_path, capsys):
    """Before: sys.exit in a reward function scored 0 on every completion, counted in metrics.jsonl only, exit 0."""
    quits = f"{{name: quits, function: '{FAILS}', weight: 1, options: {{how: exit}}}}"
    functions = f"[{{name: correct, function: verifier, weight: 1}}, {quits}]"
    out = tmp_path / "run"
    code, err = run_cli(tiny_args(tiny_model_dir, out, 2, "-o", f"reward.functions={functions}"), capsys)
    line = error_line(err)
    assert code == 2 and line.startswith(
        f"error: reward.functions quits ({FAILS}) failed on every one of the 8 completions graded together (the first: SystemExit: 3)"
    ), line
    assert not (out / "metrics.jsonl").exists()


def test_a_run_shows_the_failed_calls_of_each_step_on_its_step_line(tiny_model_dir, tmp_path):
    """Failures below reward.max_failure_share score 0 and are counted where the user looks: the step line."""
    functions = "[{name: correct, function: verifier, weight: 1}, {name: odd, function: helpers:odd_length_failing_reward, weight: 1}]"
    out = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, out, 2, "-o", f"reward.functions={functions}"))
    lines = [x.strip() for x in result.output.splitlines() if x.strip().startswith("step ")]
    metrics = read_jsonl(out / "metrics.jsonl")
    assert sum(m["verifier/errors"] for m in metrics) > 0
    for m, line in zip(metrics, lines, strict=True):
        assert line.endswith(f"failed calls scored 0: {m['verifier/errors']} errors") == (m["verifier/errors"] > 0), line
