"""User method plugins: --plugins DIR, the thinkrl.methods entry-point group, and their errors."""

import importlib.metadata
import sys
import textwrap

import pytest

import thinkrl.methods as methods
from thinkrl.errors import UserError
from thinkrl.methods import available_methods, get_method, load_plugins, method_source

PLUGIN = '''
from dataclasses import dataclass
from thinkrl.methods import Method, register
from thinkrl.methods._common import reduce

@dataclass
class Config:
    aggregation: str = "token-mean"

@register("{name}")
class M(Method):
    """A test plugin."""
    Config = Config
    def loss(self, batch):
        return reduce(-batch.advantages * batch.logp, batch, self.cfg), {{}}
'''


def write(directory, filename, name):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / filename).write_text(textwrap.dedent(PLUGIN.format(name=name)))
    return directory / filename


def test_plugin_directory_adds_methods(tmp_path):
    path = write(tmp_path / "p1", "my_method.py", "my_method_one")
    (tmp_path / "p1" / "test_my_method.py").write_text("raise RuntimeError('tests are not plugins')\n")
    assert load_plugins(tmp_path / "p1") == ["my_method_one"]
    assert "my_method_one" in available_methods() and method_source("my_method_one") == str(path)
    assert get_method("my_method_one").summary() == "A test plugin."


def test_a_duplicate_name_is_refused_naming_both_files(tmp_path):
    path = write(tmp_path / "p2", "again.py", "grpo")
    with pytest.raises(UserError) as err:
        load_plugins(tmp_path / "p2")
    assert "'grpo' is registered twice" in str(err.value)
    assert method_source("grpo") in str(err.value) and str(path) in str(err.value)


def test_a_plugin_that_fails_to_import_is_a_clear_error(tmp_path):
    (tmp_path / "p3").mkdir()
    (tmp_path / "p3" / "broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(UserError, match=r"plugin .*broken.py failed to import: ModuleNotFoundError"):
        load_plugins(tmp_path / "p3")
    with pytest.raises(UserError, match="not a directory"):
        load_plugins(tmp_path / "nope")


def test_entry_point_group(tmp_path, monkeypatch):
    write(tmp_path / "pkg", "ep_plugin.py", "ep_method")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    ep = importlib.metadata.EntryPoint(name="ep_method", value="ep_plugin", group="thinkrl.methods")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        methods.importlib.metadata, "entry_points", lambda group=None: [ep] if group == "thinkrl.methods" else real(group=group)
    )
    monkeypatch.setattr(methods, "_discovered", False)
    assert "ep_method" in available_methods()
    sys.modules.pop("ep_plugin", None)


def test_the_example_plugin_is_listed_with_plugins_flag():
    from pathlib import Path

    load_plugins(Path(__file__).parent.parent / "examples" / "custom_method")
    assert "vanilla_pg" in available_methods()
