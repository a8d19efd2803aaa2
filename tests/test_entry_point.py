"""The console-script entry point (thinkrl.cli.run): --help exits 0, --debug shows the traceback with its
cause, and a UserError of several lines prints as one `error:` line with exit status 2 (bad input of every
kind through it: test_bad_input.py)."""

import sys

import pytest
from test_bad_input import write

from thinkrl.cli import run
from thinkrl.errors import UserError


def test_help_still_exits_0_through_the_entry_point(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["thinkrl", "train", "--help"])
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out


def test_debug_shows_the_traceback_and_its_cause(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    write(plugins / "bad.py", "raise RuntimeError('boom at import')\n")
    monkeypatch.setattr(sys, "argv", ["thinkrl", "--debug", "methods", "--plugins", str(plugins)])
    with pytest.raises(UserError, match="failed to import") as err:
        run()
    assert isinstance(err.value.__cause__, RuntimeError)  # the plugin's own traceback is chained


def test_a_multi_line_message_is_printed_on_one_line(monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise UserError("first line\n  second line\n")

    monkeypatch.setattr("thinkrl.methods.available_methods", fail)
    monkeypatch.setattr(sys, "argv", ["thinkrl", "methods"])
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 2 and capsys.readouterr().err == "error: first line second line\n"
