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
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from torch import Tensor

from thinkrl.config.typecheck import build, closest, field_docs
from thinkrl.errors import UserError

if TYPE_CHECKING:
    from thinkrl.batch import TokenBatch

SHARED = ("anchor", "clip_low", "clip_high", "dual_clip", "aggregation", "norm_length")  # the _common base fields
_REGISTRY: dict[str, type[Method]] = {}
_SOURCES: dict[str, str] = {}
_discovered = False


C = TypeVar("C")


class Method(Generic[C]):
    """Base class: `class MyMethod(Method[Config])` takes `Config` (a dataclass) as its hyperparameters, so
    `self.cfg` is a Config instance; subclasses implement `loss`. (A plain `class M(Method)` with a class
    attribute `Config = ...` works too.)"""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = object
    cfg: C

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):  # Method[Config] -> Config
            if typing.get_origin(base) is Method and typing.get_args(base) and "Config" not in cls.__dict__:
                cls.Config = typing.get_args(base)[0]

    advantage: ClassVar[str] = "grpo"
    """Advantage estimator used when `advantage.estimator: auto` (grpo, no_std or rloo)."""
    reinforce_on_policy: ClassVar[bool] = True
    """Whether, at logp == old_logp == behav_logp, the gradient is REINFORCE's for the aggregation
    (checked by the contract test); False for methods that select or reweight tokens by design."""
    acts_off_policy: ClassVar[bool] = False
    """True when the method departs from REINFORCE only through its ratios: in an on-policy run (one update
    per rollout, no precision or staleness gap) every ratio is 1 and it trains like grpo with its aggregation."""
    recipe: ClassVar[dict[str, Any]] = {}
    """The regime the paper studies, as dotted config keys: `--method NAME` applies it beneath the user's
    file and -o (method.recipe: false leaves it out)."""

    def __init__(self, **overrides: Any) -> None:
        self.cfg = build(self.Config, overrides, "method.")

    @property
    def mismatch_corrected(self) -> str:
        """Which tokens the loss itself already corrects back to the policy that wrote them (a ratio against
        behav_logp, or a weight built from pi_old / mu): "none", "prefix" (the tokens of prefix_mask) or "all".
        The trainer's TIS/MIS weight pi_old / mu would correct those twice, so it leaves their weight at 1
        ("prefix") or refuses correction.mode tis / mis ("all"); thinkrl/learner/correction.py. The default
        reads an AnchoredConfig's anchor: "all" when the ratio is taken against mu (anchor=behav)."""
        return "all" if getattr(self.cfg, "anchor", None) == "behav" else "none"

    @property
    def requires(self) -> set[str]:
        """Optional TokenBatch fields this method reads, e.g. {'entropy'}; the trainer supplies exactly these."""
        return set()

    batch_statistics: ClassVar[bool] = False
    """True for methods whose loss uses statistics of the whole batch it is called with (quantiles, top-k
    selections): the trainer then passes each mini-batch in one call instead of micro-batches."""

    @property
    def topk_width(self) -> int:
        """K of the top-K proposal fields (topk_ids, topk_old_logp, topk_logp) when `requires` lists them."""
        return 0

    @property
    def js_reference(self) -> str:
        """For token_js: the mean distribution each position is compared with, 'batch' or 'response'."""
        return "batch"

    def begin_step(self, view: TokenBatch) -> dict[str, Tensor]:
        """Called once per training step, before the first update, with a detached TokenBatch `view` of the
        whole rollout batch: logp == old_logp, behav_logp, advantages, mask, and old_entropy when `requires`
        lists it. Controllers set their per-step state here (STARE's entropy gate, AIS's mixing
        coefficient); keep it in `state_dict` so `--resume` continues it. Returns metrics to log.
        The trainer runs a no-grad pass for old_logp before this when a method overrides it."""
        return {}

    def loss(self, batch: TokenBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The scalar loss to minimise and detached metrics (keys like 'clip/frac', 'ratio/mean')."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Persistent state across steps (controllers, EMAs); saved in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"method {self.name} has no state but got {sorted(state)}")

    def config_dict(self) -> dict[str, Any]:
        """The resolved hyperparameters, the method's own first (as `help` lists them)."""
        return {f.name: getattr(self.cfg, f.name) for f in _ordered_fields(self.Config)}

    @classmethod
    def summary(cls) -> str:
        """One line for `thinkrl methods`: the first line of the class docstring."""
        return (inspect.getdoc(cls) or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def help(cls) -> str:
        """Module docstring plus every config field with its default and doc line."""
        module = sys.modules.get(cls.__module__)
        lines = [inspect.getdoc(module) or "", "", "Config fields (set with -o method.<field>=<value>):"]
        docs = field_docs(cls.Config)
        for f in _ordered_fields(cls.Config):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            lines.append(f"  {f.name} = {default!r}    {docs.get(f.name, '')}".rstrip())
        lines += ["", "Recipe (applied by --method NAME beneath your config file and -o; --no-recipe leaves it out):"]
        lines += [f"  {k} = {v!r}" for k, v in cls.recipe.items()] or ["  (none: the defaults are the paper's regime)"]
        return "\n".join(lines)


def _ordered_fields(config: type) -> list[dataclasses.Field]:
    """A Config's fields, the method's own first, then those of the shared bases (methods/_common.py)."""
    return sorted(dataclasses.fields(config), key=lambda f: SHARED.index(f.name) if f.name in SHARED else -1)


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
