"""Impl records and the registry plugins fill through the ``xbackend_register_impls`` hook."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._device import Device, DeviceSpec, families
from ._precision import EXACT, Output, Precision

__all__ = ["Impl", "Registrar", "RegistrationError", "Registry"]

_IMPORTED: dict[str, Callable[..., Any]] = {}
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})


class RegistrationError(ValueError):
    """A plugin tried to register something the registry cannot accept."""


@dataclass(frozen=True)
class Impl:
    """One implementation of one op.

    ``fn`` takes the op's normalized arguments (see each op's ``bind``). ``fn`` and ``supports`` may be
    given as ``"package.module:function"`` strings, imported on first use, so registering an impl
    never imports triton or a vendor library. ``supports`` takes the same
    arguments and returns None or a short reason it cannot take them; it sees shapes, strides and
    dtypes only (it also runs on meta tensors when planning for a simulated device). ``available``
    returns None or why the impl cannot run on this host at all (a missing package, a failed build);
    it is called once and cached. ``verified_on`` lists the (torch version prefix, Triton version
    prefix, arch) runs on which the impl's precision contract was checked on real hardware (arch as
    ``Device.arch`` names it: ``"sm90"`` covers H100 and H200; a pair without one claims every
    arch); ``()`` means never (the guard still checks every first use).
    """

    op: str
    name: str
    fn: Callable[..., Output] | str
    priority: int = 0
    devices: str = "*"
    dtypes: frozenset[torch.dtype] = FLOAT_DTYPES
    precision: Precision = EXACT
    supports: Callable[..., str | None] | str | None = None
    available: Callable[[], str | None] | None = None
    description: str = ""
    backend: str = ""
    verified_on: tuple[tuple[str, ...], ...] = ()
    device_specs: tuple[DeviceSpec, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f"impl {self.op}:{self.name}" + (f" of plugin {self.backend!r}" if self.backend else "")
        for name, value, kind in (("op", self.op, str), ("name", self.name, str), ("devices", self.devices, str)):
            if not isinstance(value, kind) or not value:
                raise RegistrationError(f"{where}: {name} expected a non-empty str, got {value!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise RegistrationError(f"{where}: priority expected an int (higher runs first), got "
                                    f"{type(self.priority).__name__} {self.priority!r}")
        if not isinstance(self.precision, Precision):
            raise RegistrationError(f"{where}: precision expected xbackend.EXACT, xbackend.ulp(n) or "
                                    f"xbackend.tolerance(x), got {self.precision!r}")
        if not (callable(self.fn) or (isinstance(self.fn, str) and _IMPORT_PATH.fullmatch(self.fn))):
            raise RegistrationError(f"{where}: fn expected a callable or a 'package.module:function' string, got {self.fn!r}")
        for name in ("supports", "available"):
            value = getattr(self, name)
            if value is not None and not callable(value) and not (name == "supports" and isinstance(value, str)
                                                                   and _IMPORT_PATH.fullmatch(value)):
                raise RegistrationError(f"{where}: {name} expected None, a callable{' or a module:function string' if name == 'supports' else ''}, got {value!r}")
        try:
            dtypes = frozenset(self.dtypes)
        except TypeError:
            dtypes = frozenset({self.dtypes})
        bad = [d for d in dtypes if not isinstance(d, torch.dtype)]
        if bad or not dtypes:
            raise RegistrationError(f"{where}: dtypes expected a non-empty set of torch dtypes "
                                    f"(e.g. {{torch.bfloat16, torch.float16}}), got {self.dtypes!r}")
        try:
            specs = DeviceSpec.parse(self.devices)
        except ValueError as e:
            raise RegistrationError(f"{where}: devices: {e}") from None
        object.__setattr__(self, "device_specs", specs)
        object.__setattr__(self, "dtypes", dtypes)
        runs = []
        for run in self.verified_on:
            if (isinstance(run, str) or not 2 <= len(run) <= 3 or not all(isinstance(x, str) and x for x in run)
                    or (len(run) == 3 and not any(f.has(run[2]) for f in families()))):
                raise RegistrationError(f"{where}: verified_on expected (torch, triton) or (torch, triton, arch) "
                                        f"tuples of non-empty str, arch as Device.arch names it (sm90, gfx950), "
                                        f"e.g. ('2.11', '3.6', 'sm90'), got {run!r}")
            runs.append(tuple(run))
        object.__setattr__(self, "verified_on", tuple(runs))

    def resolved(self, field_name: str) -> Callable[..., Any] | None:
        """``fn`` or ``supports`` as a callable, importing a ``"module:attr"`` string once."""
        value = getattr(self, field_name)
        if not isinstance(value, str):
            return value
        cached = _IMPORTED.get(value)
        if cached is None:
            module, _, attr = value.partition(":")
            cached = _IMPORTED[value] = getattr(importlib.import_module(module), attr)
        return cached

    def runs_on(self, device: Device) -> bool:
        return any(spec.matches(device) for spec in self.device_specs)

    @property
    def qualname(self) -> str:
        return f"{self.backend}:{self.name}" if self.backend else self.name


class Registry:
    """Impls per op: highest priority first, then by backend name, then impl name. The reference is
    appended by the runtime, last."""

    def __init__(self, op_names: Iterable[str]) -> None:
        self._impls: dict[str, list[Impl]] = {name: [] for name in op_names}

    def add(self, impl: Impl) -> None:
        if impl.op not in self._impls:
            known = ", ".join(sorted(self._impls))
            raise RegistrationError(
                f"plugin {impl.backend!r} registered impl {impl.name!r} for unknown op {impl.op!r}; "
                f"known ops: {known}"
            )
        for other in self._impls[impl.op]:
            # Vendors may reuse a name ("triton" on NVIDIA and on AMD): the plugin-qualified name is the id.
            if other.qualname == impl.qualname:
                raise RegistrationError(
                    f"plugin {impl.backend!r} registered impl {impl.name!r} for op {impl.op!r} twice; "
                    f"impl names are unique per plugin and op"
                )
        impls = self._impls[impl.op]
        impls.append(impl)
        # Equal priorities are broken by backend name, then impl name, never by registration order:
        # plugin load order follows install order, and a plan must not change with it.
        impls.sort(key=lambda i: (-i.priority, i.backend, i.name))

    def snapshot(self) -> dict[str, list[Impl]]:
        return {op: list(impls) for op, impls in self._impls.items()}

    def restore(self, snapshot: dict[str, list[Impl]]) -> None:
        self._impls = {op: list(impls) for op, impls in snapshot.items()}

    def impls(self, op: str) -> list[Impl]:
        return list(self._impls[op])

    def ops(self) -> list[str]:
        return list(self._impls)


class Registrar:
    """What a plugin's ``xbackend_register_impls`` receives: registers impls under the plugin's name."""

    def __init__(self, registry: Registry, plugin_name: str) -> None:
        self._registry = registry
        self.plugin_name = plugin_name
        self.added: list[Impl] = []

    def register(self, impl: Impl | None = None, /, **fields: object) -> Impl:
        """``register(Impl(...))`` or ``register(op=..., name=..., fn=..., ...)``."""
        if impl is None:
            impl = Impl(**fields)  # type: ignore[arg-type]
        elif fields:
            raise TypeError("register() takes an Impl or keyword fields, not both")
        if impl.name == "reference" or impl.qualname.endswith(":reference"):
            raise RegistrationError(
                f"plugin {self.plugin_name!r} registered an impl named 'reference' for op {impl.op!r}; the name is "
                f"reserved for the op's reference (use(op='reference') forces it): choose another name"
            )
        if impl.backend and impl.backend != self.plugin_name:
            raise RegistrationError(
                f"plugin {self.plugin_name!r} registered impl {impl.name!r} claiming backend {impl.backend!r}"
            )
        impl = Impl(**{**_fields(impl), "backend": self.plugin_name})
        self._registry.add(impl)
        self.added.append(impl)
        return impl


def _fields(impl: Impl) -> dict[str, object]:
    return {f: getattr(impl, f) for f in impl.__dataclass_fields__ if f != "device_specs"}
