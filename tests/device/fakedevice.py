"""The project's fake accelerator: a device named `fakegpu` whose tensors compute on the CPU but refuse what CUDA
refuses, so that CUDA-only defects fail in a CPU-only test run (docs/fake_device.md).

With `fake_device()` active:

- a DeviceTensor reports device fakegpu:0 and holds a plain CPU tensor that every op runs on. An op that meets a
  DeviceTensor and a CPU tensor of one or more dimensions raises CUDA's "Expected all tensors to be on the same
  device" error; CUDA's exceptions are kept: a 0-dim CPU tensor (a scalar), the CPU indices of an indexing op,
  and the copies between devices (`.to`, `copy_`). Factories with device="fakegpu", `t.to("fakegpu")` and
  `module.to("fakegpu")` make DeviceTensors; `.cpu()`, `.item()` and `.tolist()` come back as on CUDA.
- `torch.Generator(device="fakegpu")` makes a DeviceGenerator (CPU state, device fakegpu:0), and a random op
  whose output lands on another device than its generator's raises CUDA's "Expected a 'cpu' device type for
  generator but found 'fakegpu'" (or the reverse).
- `nccl_collectives()` makes torch.distributed's tensor collectives refuse CPU tensors as an NCCL-only group
  does ("No backend type associated with device type cpu") and run the gloo group on a DeviceTensor's CPU data.

The modes are those of the thread that entered fake_device(); in another thread (transformers' continuous
batching decodes in one) the fake backend's kernels make the DeviceTensors and the DeviceTensors check their
own ops, but a generator passed to a CPU op there goes unchecked.

It cannot catch what is not a device check: an op CUDA lacks or runs differently (dtypes, determinism, kernels),
memory, streams and synchronisation, NCCL's own semantics, or code reading a tensor's memory (a DeviceTensor's
storage is its CPU data's, so that savers can tell which tensors share memory).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

NAME = "fakegpu"
DEVICE_INDEX = 0
aten = torch.ops.aten

# ops that CUDA runs across devices: the copies, and indexing with CPU index tensors (their argument 1)
COPIES = {aten.copy_.default, aten._to_copy.default, aten._copy_from.default, aten._copy_from_and_resize.default, aten.copy.default}
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default, aten._unsafe_index.Tensor}


@functools.cache
def install() -> torch.device:
    """Name PrivateUse1 `fakegpu` and give it the Python hooks a backend needs (once per process)."""
    from torch.utils.backend_registration import _DummyBackendModule, _setup_privateuseone_for_python_backend

    class Module(_DummyBackendModule):  # torch.fakegpu: one device, always available (torch's stand-in, named)
        __name__ = f"torch.{NAME}"

    _setup_privateuseone_for_python_backend(NAME, backend_module=Module())
    # Below the Python dispatch key (a thread the modes are not active in, torch.tensor's own copy) a factory with
    # device="fakegpu" reaches the backend's kernels: they make DeviceTensors too, and copy into them.
    lib = torch.library.Library("aten", "IMPL")  # kept for the process's life, as a backend's kernels are
    _KERNELS.append(lib)

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        return DeviceTensor(torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format))

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        return DeviceTensor(torch.empty_strided(size, stride, dtype=dtype, layout=layout))

    def copy_from(src, dst, non_blocking=False):
        inner(dst).copy_(inner(src))
        return dst

    lib.impl("empty.memory_format", empty, "PrivateUse1")
    lib.impl("empty_strided", empty_strided, "PrivateUse1")
    lib.impl("_copy_from", copy_from, "PrivateUse1")
    return torch.device(NAME, DEVICE_INDEX)


_KERNELS: list = []


def inner(t: torch.Tensor) -> torch.Tensor:
    """The CPU data of a DeviceTensor; a plain tensor as it is."""
    return t.inner if isinstance(t, DeviceTensor) else t


class DeviceTensor(torch.Tensor):
    """A tensor on fakegpu:0: the autograd-visible wrapper of `inner`, a CPU tensor of the same shape and strides."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=torch.device(NAME, DEVICE_INDEX),
            requires_grad=requires_grad,
        )

    def __init__(self, inner: torch.Tensor, requires_grad: bool = False):
        self.inner = inner

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:  # torch refuses tolist() on a subclass; CUDA copies to the CPU first
            return args[0].inner.tolist()
        if func in (torch.Tensor.untyped_storage, torch.Tensor.data_ptr):  # the device memory: savers compare pointers
            return func(args[0].inner)
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"DeviceTensor({self.inner!r}, device='{NAME}:{DEVICE_INDEX}')"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {})


def _on_fake(device) -> bool:
    return device is not None and torch.device(device).type == NAME


def run(func, args: tuple, kwargs: dict):
    """Run one aten op for the fake device: check devices as CUDA would, run it on the CPU data, wrap outputs."""
    flat, spec = tree_flatten((args, kwargs))
    meets_device = any(isinstance(x, DeviceTensor) for x in flat)
    if meets_device and func not in COPIES:
        _check_same_device(func, args, kwargs)
    to_device = _on_fake(kwargs["device"]) if kwargs.get("device") is not None else meets_device
    originals = {}  # id of what the op sees -> what the caller passed: an in-place op returns its own argument
    plain = []
    for x in flat:
        plain.append(inner(x) if isinstance(x, torch.Tensor) else x)
        if isinstance(x, torch.Tensor):
            originals[id(plain[-1])] = x
    p_args, p_kwargs = tree_unflatten(plain, spec)
    if _on_fake(p_kwargs.get("device")):
        p_kwargs = {**p_kwargs, "device": torch.device("cpu")}
    out = func(*p_args, **p_kwargs)

    def wrap(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) in originals:
            return originals[id(t)]
        return DeviceTensor(t) if to_device else t

    return tree_map(wrap, out)


def _check_same_device(func, args: tuple, kwargs: dict) -> None:
    """CUDA's rule: a CPU tensor may meet a device tensor only as a 0-dim scalar (or as an indexing op's indices)."""
    checked = [args[0], *args[2:], *kwargs.values()] if func in INDEXING else [*args, *kwargs.values()]
    for x in tree_flatten(checked)[0]:
        if isinstance(x, torch.Tensor) and not isinstance(x, DeviceTensor) and x.device.type == "cpu" and x.dim() > 0:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {NAME}:{DEVICE_INDEX} and cpu! "
                f"(in {func}; fake device)"
            )


class DeviceGenerator(torch.Generator):
    """A random generator of the fake device: CPU state, reporting fakegpu:0 as a CUDA generator reports cuda:N."""

    @property
    def device(self) -> torch.device:
        return torch.device(NAME, DEVICE_INDEX)


_REAL_GENERATOR = torch.Generator


class _GeneratorType(type):
    """torch.Generator while the fake is active: a DeviceGenerator for device fakegpu (what a C++ backend registers
    as its generator), the real class otherwise; isinstance checks against it see the real class."""

    def __call__(cls, device="cpu"):
        return DeviceGenerator() if _on_fake(device) else _REAL_GENERATOR(device)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _REAL_GENERATOR)


class _Generator(metaclass=_GeneratorType):
    pass


def _output_device(args: tuple, kwargs: dict) -> torch.device:
    """Where a random op's output lands: its device argument, else its first tensor argument's device, else the CPU."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


class _PythonLevel(TorchFunctionMode):
    """Generator checks (at the Python level, where the generator object is still the caller's), and the
    factories with device="fakegpu"."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gens = [x for x in (*args, *kwargs.values()) if isinstance(x, _REAL_GENERATOR)]
        if gens:
            where = _output_device(args, kwargs).type
            found = NAME if isinstance(gens[0], DeviceGenerator) else gens[0].device.type
            if found != where:
                raise RuntimeError(f"Expected a '{where}' device type for generator but found '{found}' (fake device)")
        if _on_fake(kwargs.get("device")):  # torch.tensor(..., device=) copies below the Python dispatch key: made here
            out = func(*args, **{**kwargs, "device": torch.device("cpu")})
            return tree_map(lambda t: t.to(NAME) if isinstance(t, torch.Tensor) else t, out)
        return func(*args, **kwargs)


class _DispatchLevel(TorchDispatchMode):
    """Every aten op while the fake is active, so that factories with device="fakegpu" make DeviceTensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {})


@contextlib.contextmanager
def fake_device() -> Iterator[torch.device]:
    """The fake device for the duration: yields fakegpu:0. Modules moved there swap their parameters for
    DeviceTensors (torch's swap path, which keeps tied weights tied)."""
    device = install()
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    torch.Generator = _Generator  # type: ignore[misc]
    try:
        with _PythonLevel(), _DispatchLevel():
            yield device
    finally:
        torch.Generator = _REAL_GENERATOR  # type: ignore[misc]
        torch.__future__.set_swap_module_params_on_conversion(swap)


TENSOR_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
)


@contextlib.contextmanager
def nccl_collectives() -> Iterator[None]:
    """torch.distributed's tensor collectives as an NCCL group serves them, over the real (gloo) group underneath.
    The object collectives (all_gather_object, ...) are left alone: they pick the backend's device themselves."""
    real = {name: getattr(dist, name) for name in TENSOR_COLLECTIVES}

    def refusing(name):
        def collective(*args, **kwargs):
            flat, spec = tree_flatten((args, kwargs))
            for x in flat:
                if isinstance(x, torch.Tensor) and not isinstance(x, DeviceTensor):
                    raise RuntimeError(f"No backend type associated with device type {x.device.type} (fake NCCL {name})")
            plain = [inner(x) if isinstance(x, torch.Tensor) else x for x in flat]
            p_args, p_kwargs = tree_unflatten(plain, spec)
            return real[name](*p_args, **p_kwargs)

        return collective

    try:
        for name in TENSOR_COLLECTIVES:
            setattr(dist, name, refusing(name))
        yield
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
