"""The Method base class: a policy loss with its own typed Config, what it needs of the batch, and its recipe.

Subclasses live one per file in this package (or in a plugin directory) and are registered by name
(thinkrl/methods/__init__.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from torch import Tensor

from thinkrl.config.typecheck import build, field_docs

if TYPE_CHECKING:
    from thinkrl.batch import TokenBatch

SHARED = ("anchor", "clip_low", "clip_high", "dual_clip", "aggregation", "norm_length")  # the _common base fields

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
    entropy_grad: ClassVar[bool] = False
    """True when the loss differentiates through batch.entropy (an entropy bonus or penalty): the training
    forward then returns it with its gradient, at the cost of a little more head work. False (the default, and
    stare, entropy_fork, stapo's choice: they only select or gate tokens by entropy) hands it over detached."""
    recipe: ClassVar[dict[str, Any]] = {}
    """The regime the paper studies, as dotted config keys: `--method NAME` applies it beneath the user's
    file and -o (method.recipe: none leaves it out; method.recipe: OTHER applies OTHER's instead)."""

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
    selections): the trainer then passes each mini-batch in one call instead of micro-batches. With several
    processes each holds part of the mini-batch, and the loss pools its statistic through `batch.gather`
    (methods/_common.py whole_batch), called the same number of times on every process."""

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
        whole rollout batch (every process's rows, so the state is the same on each and at any process count):
        logp == old_logp, behav_logp, advantages, mask, and old_entropy when `requires` lists it. Controllers
        set their per-step state here (STARE's entropy gate, AIS's mixing coefficient); keep it in `state_dict`
        so `--resume` continues it. Returns metrics to log.
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
        lines += ["", "Recipe (applied by --method NAME beneath your config file and -o; --recipe none leaves it out):"]
        lines += [f"  {k} = {v!r}" for k, v in cls.recipe.items()] or ["  (none: the defaults are the paper's regime)"]
        return "\n".join(lines)


def _ordered_fields(config: type) -> list[dataclasses.Field]:
    """A Config's fields, the method's own first, then those of the shared bases (methods/_common.py)."""
    return sorted(dataclasses.fields(config), key=lambda f: SHARED.index(f.name) if f.name in SHARED else -1)
