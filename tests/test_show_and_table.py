"""`thinkrl show` prints each completion's extracted answer; the eval table prints avg@n's 95% interval and
warns when most completions hit the token budget."""

import json

from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.evaluation.metrics import print_table
from thinkrl.run.console import console


def rollout(completion, score, **extra):
    return {
        "step": 1,
        "prompt_id": "p0",
        "prompt": "Halve 1.",
        "answer": "1/2",
        "completion": completion,
        "reward": score,
        "score": score,
        "advantage": 0.0,
        "length": 5,
        "truncated": False,
        **extra,
    }


def test_show_prints_the_extracted_answer(tmp_path):
    rows = [
        rollout("so \\boxed{3} then \\boxed{\\frac{1}{2}}", 1.0),  # the last box
        rollout("I think \\boxed{[bold]x[/]}", 0.0),  # printed as text, not as markup
        rollout("no box at all", 0.0),
        rollout("unboxed 0.5", 1.0, extracted="0.5"),  # a logged answer wins
    ]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 0, result.output
    answers = [line.split("answer: ", 1)[1] for line in result.output.splitlines() if " reward " in line]
    assert answers == ["\\frac{1}{2}", "[bold]x[/]", "none", "0.5"]


def summary(dataset, avg, low, high, truncated, budget=3000):
    metrics = {"avg@4": avg, "avg@4_ci95_low": low, "avg@4_ci95_high": high, "pass@1": avg, "maj@4": 0.5, "truncated_frac": truncated}
    return {"dataset": dataset, "problems": 30, "metrics": metrics, "settings": {"max_new_tokens": budget}}


def printed(summaries, monkeypatch):
    monkeypatch.setattr(console, "width", 200)
    with console.capture() as cap:
        print_table(summaries)
    return cap.get()


def test_eval_table_shows_the_interval_and_warns_on_truncation(monkeypatch):
    out = printed([summary("data/aime24.jsonl", 0.35, 0.2123, 0.4877, 0.25), summary("math500", 0.1, 0.0, 0.2, 0.75, 512)], monkeypatch)
    assert "0.350 [0.21, 0.49]" in out and "0.100 [0.00, 0.20]" in out
    assert "0.350 [" not in out.split("0.350 [0.21, 0.49]", 1)[1]  # pass@1 has no interval of its own
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: math500: 75% of the completions hit the 512-token budget, so most answers were cut off before they were "
        "given; raise --max-new-tokens"
    ]
    assert "warning" not in printed([summary("aime24", 0.35, 0.2, 0.5, 0.5)], monkeypatch)  # half is not most
