"""Policy-loss methods: a registry filled by one file per method.

    from thinkrl.methods import get_method, available_methods
    m = get_method("grpo", clip_high=0.28)   # unknown name or field -> UserError naming it
    loss, metrics = m.loss(batch)            # batch: thinkrl.batch.TokenBatch -> (scalar, detached metrics)

A method is a `Method` subclass decorated with `@register("name")`, holding a dataclass `Config` of its
own hyperparameters (usually a subclass of `_common.ClipConfig` or `_common.Reduction` that overrides
defaults) and a `loss(batch)` that sees tensors only. Every module in this package is imported
on first use, so a new method is a new file. `load_plugins(DIR)` adds a user's directory and the
`thinkrl.methods` entry-point group adds installed packages. Registering a name twice is an error that
names both files.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import pkgutil
import sys
from pathlib import Path
from typing import Any

from thinkrl.config.typecheck import closest
from thinkrl.errors import UserError
from thinkrl.methods.base import Method

_REGISTRY: dict[str, type[Method]] = {}
_SOURCES: dict[str, str] = {}
_discovered = False


def register(name: str):
    """Class decorator: `@register("grpo") class GRPO(Method): ...`."""

    def wrap(cls: type[Method]) -> type[Method]:
        source = inspect.getfile(cls)
        if name in _REGISTRY:
            raise UserError(f"method name '{name}' is registered twice: in {_SOURCES[name]} and in {source}")
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise UserError(f"{source}: @register('{name}') must decorate a subclass of thinkrl.methods.Method")
        if not dataclasses.is_dataclass(cls.Config):
            raise UserError(f"{source}: method '{name}' needs a dataclass `Config`")
        cls.name = name
        _REGISTRY[name] = cls
        _SOURCES[name] = source
        return cls

    return wrap


def _discover() -> None:
    """Import every method module of this package, then the entry-point plugins, once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    for ep in importlib.metadata.entry_points(group="thinkrl.methods"):
        try:
            ep.load()
        except UserError:
            raise
        except (Exception, SystemExit) as e:  # a broken third-party plugin must not look like a thinkrl bug
            raise UserError(
                f"method plugin entry point '{ep.name}' ({ep.value}) failed to import: {_describe(e)}; "
                "fix or uninstall the package that provides it (`thinkrl --debug` shows the traceback)"
            ) from e


def load_plugins(directory: str | Path) -> list[str]:
    """Import every `*.py` in `directory` except `_*.py` and `test_*.py`; returns the names they registered."""
    _discover()
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"--plugins {directory}: not a directory")
    before = set(_REGISTRY)
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith(("_", "test_")):  # a plugin directory may carry its own tests
            continue
        mod_name = f"thinkrl_plugin_{abs(hash(str(path.resolve())))}_{path.stem}"
        if mod_name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise UserError(f"plugin {path} cannot be imported as a Python module; rename it to a plain name.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except UserError:
            del sys.modules[mod_name]
            raise
        except (Exception, SystemExit) as e:  # SystemExit: a plugin calling sys.exit() at import
            del sys.modules[mod_name]
            line = _plugin_line(e, path)
            raise UserError(
                f"plugin {path} failed to import: {_describe(e)}{f' (line {line})' if line else ''}; "
                f"fix it, or move it out of {directory} (`thinkrl --debug` shows the traceback)"
            ) from e
    return sorted(set(_REGISTRY) - before)


def _describe(e: BaseException) -> str:
    """'SyntaxError: invalid syntax' (without SyntaxError's own '(file, line N)': the caller names those)."""
    msg = e.msg if isinstance(e, SyntaxError) and e.msg else str(e).strip()
    msg = msg.splitlines()[0][:200] if msg else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _plugin_line(e: BaseException, path: Path) -> int | None:
    """The line of the plugin file itself where the import failed (the deepest frame in it)."""
    if isinstance(e, SyntaxError) and e.filename and Path(e.filename).resolve() == path.resolve():
        return e.lineno
    line, tb = None, e.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def available_methods() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def method_class(name: str) -> type[Method]:
    _discover()
    if name not in _REGISTRY:
        names = sorted(_REGISTRY)
        raise UserError(f"unknown method '{name}'{closest(name, names)}; available: {', '.join(names)}")
    return _REGISTRY[name]


def get_method(name: str, **overrides: Any) -> Method:
    """Instantiate a registered method with its Config fields overridden."""
    return method_class(name)(**overrides)


def method_source(name: str) -> str:
    method_class(name)
    return _SOURCES[name]
