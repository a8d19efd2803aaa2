"""Load a peer framework's loss functions from its own published source, to compare thinkrl's losses with them.

verl's policy losses come from its PyPI wheel (`make install` downloads verl 0.9.1 into .peers/, without its
dependencies); prime-rl is not on PyPI, so its loss module is read from a checkout named by THINKRL_PRIME_RL.
A peer module imports much of its framework (ray, tensordict, its config classes); the functions compared here
use none of it, so those imports are answered by stand-in modules for the length of the load and removed from
sys.modules afterwards. Nothing of the peer's code is copied into this repository: it is executed as published.
"""

from __future__ import annotations

import os
import sys
import types
import zipfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERL_VERSION = "0.9.1"
VERL_WHEEL = ROOT / ".peers" / f"verl-{VERL_VERSION}-py3-none-any.whl"


class StandIn:
    """Any class a peer module imports but the compared functions only construct or check with isinstance."""

    def __init__(self, *args, **kwargs) -> None:
        self.__dict__.update(kwargs)

    def __class_getitem__(cls, item):  # jaxtyping's Float[Tensor, "seq"]
        return cls


class StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (StandIn,), {})
        setattr(self, name, value)
        return value


def _identity_decorator(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


@contextmanager
def stand_ins(names: list[str], real: dict[str, types.ModuleType] | None = None):
    """Modules `names` answered by stand-ins (each parent given its child as an attribute) and `real` ones
    registered, for the duration of a load; sys.modules is restored afterwards."""
    saved = {n: sys.modules.get(n) for n in [*names, *(real or {})]}
    made: dict[str, types.ModuleType] = {}
    for name in names:
        made[name] = sys.modules[name] = StandInModule(name)
    for name, module in (real or {}).items():
        made[name] = sys.modules[name] = module
    for name, module in made.items():
        parent, _, child = name.rpartition(".")
        if parent in made:
            setattr(made[parent], child, module)
    try:
        yield made
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _exec(name: str, source: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # a module may look itself up while it runs (dataclasses, typing)
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


VERL_STANDINS = [
    "verl",
    "verl.utils",
    "verl.utils.device",
    "verl.utils.import_utils",
    "verl.trainer",
    "verl.trainer.config",
    "verl.trainer.config.algorithm",
    "verl.trainer.ppo",
    "verl.workers",
    "verl.workers.config",
    "verl.workers.config.actor",
    "verl.protocol",
    "omegaconf",
    "tensordict",
    "transformers",
]


def verl_modules(wheel: Path = VERL_WHEEL) -> tuple[types.ModuleType, types.ModuleType]:
    """verl's core_algos and rollout_corr_helper, executed from the wheel's own files."""
    files = ("utils/torch_functional.py", "trainer/ppo/core_algos.py", "trainer/ppo/rollout_corr_helper.py")
    with zipfile.ZipFile(wheel) as z:
        read = {n: z.read(f"verl/{n}").decode() for n in files}
    with stand_ins(VERL_STANDINS) as made:
        made["verl.utils.import_utils"].deprecated = _identity_decorator  # type: ignore[attr-defined]
        made["verl.workers.config"].ActorConfig = made["verl.workers.config.actor"].PolicyLossConfig = StandIn  # type: ignore[attr-defined]
        functional = _exec("verl.utils.torch_functional", read["utils/torch_functional.py"], "verl/utils/torch_functional.py")
        made["verl.utils"].torch_functional = functional  # type: ignore[attr-defined]
        core = _exec("verl.trainer.ppo.core_algos", read[files[1]], f"verl/{files[1]}")
        helper = _exec("verl.trainer.ppo.rollout_corr_helper", read[files[2]], f"verl/{files[2]}")
        for name in ("verl.utils.torch_functional", "verl.trainer.ppo.core_algos", "verl.trainer.ppo.rollout_corr_helper"):
            sys.modules.pop(name, None)
    return core, helper


def prime_rl_loss() -> types.ModuleType | None:
    """prime-rl's src/prime_rl/trainer/rl/loss.py from the checkout THINKRL_PRIME_RL names (the file or the repo)."""
    where = os.environ.get("THINKRL_PRIME_RL")
    if not where:
        return None
    path = Path(where)
    path = path if path.is_file() else path / "src" / "prime_rl" / "trainer" / "rl" / "loss.py"
    names = ["beartype", "jaxtyping", "prime_rl", "prime_rl.configs", "prime_rl.configs.trainer", "prime_rl.utils", "prime_rl.utils.utils"]
    with stand_ins(names) as made:
        made["jaxtyping"].jaxtyped = _identity_decorator  # type: ignore[attr-defined]
        made["beartype"].beartype = _identity_decorator  # type: ignore[attr-defined]
        module = _exec("prime_rl_loss", path.read_text(), str(path))
        sys.modules.pop("prime_rl_loss", None)
    return module
