"""Every hook an xbackend plugin can implement.

A plugin is a module (or object) exposing functions named after these specs and decorated with
``xbackend.hookimpl``. Plugins are found through the ``xbackend`` entry-point group; the builtin
CUDA and ROCm backends are found exactly the same way. Hook functions may declare any subset of a
spec's arguments, as in pluggy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import torch

    from ._device import Device, DeviceFamily
    from ._registry import Impl, Registrar

hookspec = pluggy.HookspecMarker("xbackend")


class RuntimeView(Protocol):
    """What a hook may read of the runtime that calls it (``xbackend.Runtime`` is one). Declared here,
    not imported, so this module depends on nothing that loads plugins."""

    plugins: dict[str, Any]  # name -> status: source, error, impls
    problems: list[str]

    def candidates(self, op: str) -> list[Impl]: ...

    def device(self, where: Any) -> Device: ...


@hookspec
def xbackend_register_impls(registrar: Registrar) -> None:
    """Register this plugin's implementations.

    Call ``registrar.register(op=..., name=..., fn=..., priority=..., devices=..., dtypes=...,
    precision=..., supports=..., available=..., verified_on=...)`` once per impl (see
    :class:`xbackend.Impl`). Impls are recorded under the plugin's name. Registering for an op the core
    does not know, or reusing an impl name for the same op, raises :class:`xbackend.RegistrationError`;
    the plugin is then reported as failed and none of its impls are kept. Keep this hook cheap: import
    heavy dependencies (triton, vendor libraries) inside ``fn`` or ``available``, not here.

    Calling convention: ``fn`` and ``supports`` get the op's arguments positionally, in the order of its
    signature, every one present (defaults filled in, values normalized by the op's ``bind``, e.g.
    neighborhood_attention's ``kernel_size=7`` as a tuple), never by keyword. For ``rmsnorm(x,
    weight=None, eps=1e-6, flavour="torch")`` they are ``fn(x, weight, eps, flavour)`` and
    ``supports(x, weight, eps, flavour)``; ``xbackend ops --signatures`` prints every op's.

    An argument value the impl does not handle (``weight=None``, a flavour, a dtype, a stride, a head
    size) is declined by ``supports``: return a short reason (a str), or None to accept. The resolver
    then takes the next candidate, and ``xbackend plan`` shows the reason. ``supports`` reads shapes,
    strides, dtypes and the other arguments' values only (it also runs on meta tensors when planning for
    a simulated target), must not raise, and is asked once per runtime key (those, plus data-pointer
    alignment). An ``fn`` that raises, or answers outside its precision contract, on an input
    ``supports`` accepted is disabled for that input with a ``FallbackWarning``.

    An ``fn`` returns new contiguous tensors: never an input or a view of one (empty ones included),
    never two outputs over one allocation, and never writes its inputs. The guard rejects an impl
    that breaks this (docs/guard.md), as ``xbackend.testing.conformance`` does in a plugin's tests.

    ``verified_on`` lists the (torch, Triton, arch) runs on real hardware that checked the impl's
    precision contract (its op's conformance cases); ``xbackend info`` and ``xbackend fleet`` flag a
    chosen impl whose versions and arch no run matches. A CPU impl's hardware is the CPU: arch ``"cpu"``,
    and a run of ``pytest --xbackend-conformance=NAME`` on a CPU host is its check, recorded with that
    host's torch and Triton versions (Triton even when the impl does not use it: a run is keyed by both),
    e.g. ``verified_on=(("2.13", "3.9", "cpu"),)``. A Triton kernel run on a CPU under
    ``TRITON_INTERPRET=1`` verifies nothing for a GPU arch. How the fleet goldens treat impls of plugins
    beyond the builtin ones: see docs/fleet.md.
    """


@hookspec
def xbackend_device_families() -> list[DeviceFamily]:
    """Device families this plugin adds to the devices grammar of ``Impl.devices``, e.g.
    ``[DeviceFamily("xpu", r"xe\\d+", spelling="xeN", examples=("xe2", "xe3"))]``.

    Collected before any plugin registers impls, so every plugin's ``xbackend_register_impls`` may
    then name ``devices="xpu"``, ``"xe2"`` or ``"xe2.."``; the family is known while the runtime
    registers impls (construct such ``Impl`` records in that hook, not at import). Pair it with
    ``xbackend_simulated_targets`` (planning for the family's GPUs) and ``xbackend_probe_device`` (its
    real devices, with ``Device.vendor`` the family's vendor). A family whose vendor or arch names
    clash with a known one is a load-time problem and is left out.
    """


@hookspec(firstresult=True)
def xbackend_probe_device(device: torch.device) -> Device | None:
    """Describe ``device`` (vendor, arch, name, index), or return None to leave it to the next plugin.

    The core's own probe handles CUDA, ROCm and CPU and runs when no plugin answers. A plugin for a
    new device type answers for its own devices only. The first non-None result wins and is cached
    per device for the life of the runtime.
    """


@hookspec
def xbackend_simulated_targets() -> dict[str, Device]:
    """Extra planning targets, keyed by name (``{"gfx1201": Device("rocm", "gfx1201", ...)}``).

    ``xbackend.plan(op, device=name)`` and ``xbackend plan --device name`` accept them beside the
    builtin ``sm80 sm90 sm100 sm103 sm120 gfx942 gfx950 cpu``. Devices returned here should have
    ``simulated=True``.
    """


@hookspec
def xbackend_report_header(runtime: RuntimeView) -> list[str] | None:
    """Lines this plugin adds to ``xbackend info`` (library versions, build caches, notes)."""
