"""Run an impl's own launch path for a GPU this host does not have, recording the Triton kernels it
would compile instead of launching them.

The impl is called on fake CUDA tensors (``FakeTensorMode``: shapes, strides and dtypes, no storage)
while the questions launch code asks about the device are answered as the target would answer them
(``torch.version.hip``, the compute capability, the current device). Triton's own ``JITFunction.run``
then binds the arguments and derives the specialisation exactly as on the GPU, for the target's
backend (a stand-in driver reports the target); only ``JITFunction._do_compile``, the step that would
compile and cache the kernel, is replaced by a recorder. So grid, constexprs, launch options and the
specialisation (pointer and integer divisibility, integers equal to 1, AMD's 2 GB pointer ranges)
come from the vendor's launch code and Triton's rules, never from a copy of either. A CUDA C++ kernel
that a launch path takes instead of a Triton one (``native.NATIVE_LAUNCHES``) is recorded in its
place, its build on this host answered as built.

Needs kernels decorated outside Triton's interpreter (``TRITON_INTERPRET`` unset when the kernel
modules were imported); ``compile.py`` runs this in worker processes started without it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from xbackend.fleet.native import NATIVE_LAUNCHES, NativeLaunch

__all__ = ["Launch", "Specialisation", "capture", "gpu_target", "resolve", "simulated_gpu"]

# Base address given to every captured tensor: the CUDA/HIP caching allocators hand out blocks
# aligned to at least 512 bytes, so a tensor's alignment is that of its storage offset in bytes.
_BASE_ADDRESS = 1 << 21


@dataclass(frozen=True)
class Specialisation:
    """One Triton kernel specialisation as ``triton.compile`` takes it (hashable, picklable)."""

    kernel: str  # "module:qualname" of the @triton.jit function
    name: str
    signature: tuple[tuple[str, str], ...]  # (parameter, Triton type), every parameter in order
    constexprs: tuple[tuple[tuple[int, ...], Any], ...]  # (argument path, value)
    attrs: tuple[tuple[tuple[int, ...], tuple[tuple[str, Any], ...]], ...]  # (argument path, attributes)
    options: tuple[tuple[str, Any], ...]  # the backend's parsed options, by name

    @property
    def option(self) -> dict[str, Any]:
        return dict(self.options)

    def key(self) -> str:
        """A stable text key: equal exactly when Triton would compile the same binary."""
        return repr((self.kernel, self.signature, self.constexprs, self.attrs, self.options))

    def describe(self) -> str:
        """The first pointer's type, then each constexpr parameter as name=value, then the warps:
        ``*bf16 D=4096 FLAVOUR=0 ... num_warps=8`` (what a waiver pattern can name)."""
        names = [n for n, _ in self.signature]
        pointer = next((t for _, t in self.signature if t.startswith("*")), "")
        consts = [f"{names[k[0]]}={v}" for k, v in self.constexprs if len(k) == 1 and k[0] < len(names)]
        return " ".join([pointer, *consts, f"num_warps={self.option.get('num_warps', '?')}"]).strip()


@dataclass(frozen=True)
class Launch:
    """One kernel launch the impl made: what it would compile and on what grid."""

    spec: Specialisation | NativeLaunch
    grid: tuple[int, ...]  # () for a native launch: its host code sizes the grid


def gpu_target(arch: str) -> Any:
    """Triton's compile target for an arch name: ``sm90`` -> cuda 90 (warp 32), ``gfx950`` -> hip (wave 64)."""
    from triton.backends.compiler import GPUTarget

    if m := re.fullmatch(r"sm_?(\d+)[a-z]?", arch):
        return GPUTarget("cuda", int(m.group(1)), 32)
    if re.fullmatch(r"gfx[0-9a-f]+", arch):
        return GPUTarget("hip", arch, 64)
    raise ValueError(f"no Triton target for arch {arch!r}")


def _capability(arch: str) -> tuple[int, int]:
    """What ``torch.cuda.get_device_capability`` reports there: sm100 -> (10, 0); ROCm builds
    report gfx942 as (9, 4), gfx950 as (9, 5) (the arch's major and minor digits)."""
    if m := re.fullmatch(r"sm_?(\d+)[a-z]?", arch):
        n = int(m.group(1))
        return (n // 10, n % 10)
    digits = arch.removeprefix("gfx")
    return (int(digits[:-2], 16), int(digits[-2], 16))


def resolve(ref: str | Callable[..., Any]) -> Any:
    """An object named "module:attr" (or the object itself)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def ast_source(spec: Specialisation) -> Any:
    """The ``triton.compile`` source of a captured launch: a Gluon kernel needs Gluon's own source
    (its module carries the warp count its layouts are checked against)."""
    from triton.compiler import ASTSource

    fn = resolve(spec.kernel)
    attrs = {k: [list(a) for a in v] for k, v in spec.attrs}
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn, dict(spec.signature), dict(spec.constexprs), attrs)
    return ASTSource(fn, dict(spec.signature), dict(spec.constexprs), attrs)


class _Pointer:
    """A tensor argument as Triton's specialisation reads it: dtype, address and the span it covers."""

    __slots__ = ("_address", "_span", "dtype")

    def __init__(self, t: torch.Tensor) -> None:
        self.dtype = t.dtype
        self._address = _BASE_ADDRESS + t.storage_offset() * t.element_size()
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
        self._span = (t.storage_offset() + span) * t.element_size()

    def data_ptr(self) -> int:
        return self._address

    def ptr_range(self) -> int:  # AMD's buffer-op specialisation: is the allocation under 2 GB
        return self._span


class _Driver:
    """The driver Triton's JIT asks for the current device, stream and target."""

    def __init__(self, target: Any, device: int) -> None:
        self.target = target
        self.device = device

    def get_current_device(self) -> int:
        return self.device

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cuda", 0)


# Triton keys its per-device binders by device index; one index per target keeps them apart.
_DEVICE_IDS: dict[str, int] = {}


def _kernel_name(jit_fn: Any) -> str:
    fn = jit_fn.fn
    return f"{fn.__module__}:{fn.__qualname__}"


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


def _record_native(launches: list[Launch], native: NativeLaunch, *args: Any, **kwargs: Any) -> None:
    launches.append(Launch(native, ()))


@contextlib.contextmanager
def simulated_gpu(arch: str, vendor: str) -> Iterator[list[Launch]]:
    """Inside: launch code sees a ``vendor`` GPU of ``arch`` as device 0, and every Triton launch is
    recorded (in order) in the yielded list instead of compiled or launched."""
    from triton.runtime.driver import driver as triton_driver
    from triton.runtime.jit import JITFunction

    from xbackend.kernels import _triton_launch

    target = gpu_target(arch)
    device = _DEVICE_IDS.setdefault(arch, 1_000_000 + len(_DEVICE_IDS))
    launches: list[Launch] = []
    pending: list[Specialisation] = []
    real_run = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        args = tuple(_Pointer(a) if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: _Pointer(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        pending.clear()
        real_run(self, *args, grid=grid, warmup=True, **kwargs)
        if not pending:
            raise RuntimeError(f"Triton did not reach compilation for {self.fn.__name__}")
        if callable(grid):  # grid(META): the launch's arguments by parameter name
            grid = grid(inspect.signature(self.fn).bind(*args, **kwargs).arguments)
        shape = tuple(grid) if isinstance(grid, tuple | list) else (grid,)
        launches.append(Launch(pending[0], tuple(int(g) for g in shape)))
        return None  # no compiled kernel: launch code caches nothing from this call

    def do_compile(
        self: Any, key: Any, signature: dict, device: int, constexprs: dict, options: Any, attrs: dict, *_: Any
    ) -> None:
        pending.append(
            Specialisation(
                kernel=_kernel_name(self),
                name=self.fn.__name__,
                signature=tuple(signature.items()),
                constexprs=tuple(sorted((k, _freeze(v)) for k, v in constexprs.items())),
                attrs=tuple(sorted((k, _freeze(v)) for k, v in attrs.items())),
                options=tuple(sorted((k, _freeze(v)) for k, v in vars(options).items())),
            )
        )
        return None

    hip = "6.4" if vendor == "rocm" else None
    cap = _capability(arch)
    previous_driver = getattr(triton_driver, "_active", None)
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    rms = importlib.import_module("xbackend.kernels.rmsnorm.launch")
    patches = [
        mock.patch.object(JITFunction, "run", run),
        mock.patch.object(JITFunction, "_do_compile", do_compile),
        mock.patch.object(torch.version, "hip", hip),
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "device_count", lambda: 1),
        mock.patch.object(torch.cuda, "current_device", lambda: 0),
        mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: cap),
        mock.patch.object(_triton_launch, "_current_device", lambda: 0),
    ]
    for native in NATIVE_LAUNCHES:
        patches += [
            mock.patch(native.launch.replace(":", "."), functools.partial(_record_native, launches, native)),
            mock.patch(native.available.replace(":", "."), lambda: None),
        ]
    try:
        with contextlib.ExitStack() as stack, warnings.catch_warnings():
            # FakeTensor.data_ptr() warns (and returns 0); Triton's specialisation reads _Pointer instead.
            warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
            for p in patches:
                stack.enter_context(p)
            triton_driver.set_active(_Driver(target, device))
            rms._pdl_capable.cache_clear()  # answers per device index: this device is the target now
            if not isinstance(rms._rmsnorm_exact_kernel, JITFunction):  # any kernel module tells
                raise RuntimeError("kernels were decorated under TRITON_INTERPRET=1; capture needs compiled kernels")
            yield launches
    finally:
        rms._pdl_capable.cache_clear()
        triton_driver.set_active(previous_driver)
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret


def capture(
    arch: str,
    vendor: str,
    fn: Callable[..., Any],
    make: Callable[[torch.dtype, torch.device], tuple],
    dtype: torch.dtype,
    supports: Callable[..., str | None] | None = None,
) -> tuple[str | None, list[Launch]]:
    """``(reason, launches)``: why the impl does not take this input (its ``supports``), or the
    launches it makes for it on the simulated ``arch``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with simulated_gpu(arch, vendor) as launches, FakeTensorMode(allow_non_fake_inputs=True):
        args = make(dtype, torch.device("cuda", 0))
        if supports is not None:
            reason = supports(*args)
            if reason:
                return reason, []
        fn(*args)
        return None, list(launches)
