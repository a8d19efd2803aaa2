"""Terminal safety (issue 19): model output and data reach the terminal as text. Escape sequences in a completion,
a dataset problem or answer, a data file's column name or id, a run's config or a file name are printed visibly
(ESC as the four characters \\x1b), never obeyed: no window title set, no screen cleared, no clipboard written
(OSC 52), no hyperlink made; rich markup in them is printed as written."""

import json

import pytest
import yaml
from test_cli_e2e import invoke, tiny_args
from test_faults import error_line, run_cli
from typer.testing import CliRunner

from thinkrl.cli import app
from thinkrl.evaluation.metrics import print_table
from thinkrl.run.console import console, printable, shown

OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # write "pwned" to the clipboard
TITLE = "\x1b]0;pwned\x1b\\"  # set the window title (ST-terminated)
CLEAR = "\x1b[2J\x1b[3J\x1bc"  # clear the screen and the scrollback, reset the terminal
C1 = "\x9b2J\x9d0;t\x9c"  # the same as 8-bit C1 controls (CSI, OSC, ST)
MARKUP = "[link=https://example.invalid]click[/link] [bold red]loud[/]"
PAYLOAD = f"{OSC52}{TITLE}{CLEAR}{C1}\r\x08\x7f {MARKUP}"


def assert_inert(out: str) -> None:
    """Nothing of the payload acts: the only escapes left are rich's own colours and cursor moves (CSI ... m/K/A, ?25)."""
    for bad in ("\x1b]", "\x1b\\", "\x1b[2J", "\x1b[3J", "\x1bc", "\x07", "\x9b", "\x9c", "\x9d", "\x08", "\x7f", "\r"):
        assert bad not in out, (bad, out)
    assert "\\x1b]52;c;cHduZWQ=\\x07" in out  # shown, so a reader sees what the model wrote


@pytest.fixture
def terminal(monkeypatch):
    """The console as on a real terminal (colours, live progress), wide enough not to wrap a line."""
    from rich.color import ColorSystem

    monkeypatch.setattr(console, "_force_terminal", True)
    monkeypatch.setattr(console, "_color_system", ColorSystem.STANDARD)
    monkeypatch.setattr(console, "width", 2000)
    return console


def test_printable():
    assert printable(PAYLOAD) == (
        "\\x1b]52;c;cHduZWQ=\\x07\\x1b]0;pwned\\x1b\\\\x1b[2J\\x1b[3J\\x1bc\\x9b2J\\x9d0;t\\x9c\\x0d\\x08\\x7f " + MARKUP
    )
    assert printable("line 1\n\tline 2 \u00e9\u4e2d \u2212") == "line 1\n\tline 2 \u00e9\u4e2d \u2212"  # text stays text
    assert printable("abc\u202edcba") == "abc\\u202edcba"  # a bidi override cannot reorder what a line appears to say
    assert printable(3) == "3"
    assert shown("[bold]x[/]\x1b") == "\\[bold]x\\[/]\\x1b"


def rollout(**extra):
    return {
        "step": 1,
        "prompt_id": f"p{TITLE}",
        "prompt": f"What is 1 + 1? {PAYLOAD}",
        "answer": f"2{CLEAR}",
        "completion": f"so {PAYLOAD} \\boxed{{2{OSC52}}}",
        "reward": 1.0,
        "score": 1.0,
        "advantage": 0.0,
        "length": 5,
        "truncated": False,
        **extra,
    }


def test_show_prints_a_hostile_completion_as_text(tmp_path, terminal):
    rows = [rollout(), rollout(extracted=f"{OSC52}[red]x[/]", score=0.0, reward=0.0)]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["show", str(tmp_path), "--max-chars", "0"])
    assert result.exit_code == 0, result.output
    assert_inert(result.output)
    assert MARKUP in result.output and "[red]x[/]" in result.output  # markup printed as written
    assert "\\x1b]0;pwned\\x1b\\" in result.output and "\\x1b[2J" in result.output  # id, answer


def test_error_lines_quote_data_values_as_text(tmp_path, capsys):
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(json.dumps({"id": OSC52, "problem": p, "answer": "1"}) + "\n" for p in ("a", "b")))
    code, err = run_cli(["eval", "--model", tmp_path / "no-model", "--dataset", dup], capsys)
    assert code == 2 and "also the id of a different problem" in error_line(err)
    assert_inert(err)
    cols = tmp_path / "cols.jsonl"
    cols.write_text(json.dumps({f"problem{OSC52}": "a", "answer": "1"}) + "\n")
    code, err = run_cli(["eval", "--model", tmp_path / "no-model", "--dataset", cols], capsys)
    assert code == 2 and "has no column 'problem'" in error_line(err)
    assert_inert(err)


def test_the_eval_table_and_compare_print_names_as_text(tmp_path, terminal, monkeypatch):
    metrics = {"avg@1": 0.5, "pass@1": 0.5, "maj@1": 0.5, "truncated_frac": 0.9}
    summary = {"dataset": f"data/aime{OSC52}[bold red]loud.jsonl", "problems": 3, "metrics": metrics, "settings": {"max_new_tokens": 8}}
    with console.capture() as cap:
        print_table([summary])
    out = cap.get()
    assert_inert(out)
    assert "\x1b[1m" in out  # a terminal's console: rich's own styles are there
    assert "warning: aime\\x1b]52;c;cHduZWQ=\\x07[bold red]loud: 90%" in out  # the truncation warning names it too
    for i, name in enumerate((f"grpo{OSC52}", f"dapo{MARKUP}")):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "config.yaml").write_text(yaml.safe_dump({"method": {"name": name}}))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5, f"eval/x{TITLE}/avg@1": 0.25}) + "\n")
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "run0"), str(tmp_path / "run1")])
    assert result.exit_code == 0, result.output
    assert_inert(result.output)
    assert "\\x1b]0;pwned" in result.output and "dapo[link=" in result.output


@pytest.mark.plain
def test_a_hostile_dataset_through_training_show_and_eval(tiny_model_dir, tmp_path, terminal, capsys):
    """Problems and ids carry the payload (and, for eval, the file's own name); nothing printed obeys it."""
    data = tmp_path / "math.jsonl"
    rows = [{"id": f"q{i}{OSC52}", "problem": f"What is {i} + 1? {PAYLOAD}", "answer": str(i + 1)} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    result = invoke(tiny_args(tiny_model_dir, run, 1, "--dataset", str(data), "-o", "log.rollouts_every=1"))
    assert_inert_without_sample(result.output)
    shown_run = CliRunner().invoke(app, ["show", str(run)])
    assert shown_run.exit_code == 0, shown_run.output
    assert_inert(shown_run.output)
    named = data.rename(tmp_path / f"math{TITLE}.jsonl")
    code, err = run_cli(
        ["eval", "--model", tiny_model_dir, "--dataset", named, "--max-new-tokens", "4", "--output", tmp_path / "ev"], capsys
    )
    assert code == 0, err
    assert_inert_without_sample(err)
    assert "math\\x1b]0;pwned" in err  # the table names the file as text


def assert_inert_without_sample(out: str) -> None:
    """assert_inert for output that need not quote the payload itself (training and eval print no problem text)."""
    assert_inert(out + "\\x1b]52;c;cHduZWQ=\\x07")
