"""Plan the op × dtype × quality matrix for each target in one process, and the JSON envelope
around the plans (versions, plugin status, host assumptions).

A simulated target is planned as deployed on that GPU: an impl's ``available`` check (a CUDA build,
nvcc, an importable aiter or NATTEN) answers for this host, not the target, so it counts as passed
there, and each impl whose check failed here is listed as an assumption with this host's reason.
A real device is planned with its real availability.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .._api import Plan, kernel_ops, plan
from .._device import Device
from .._registry import Impl
from .skew import Unverified, host_lane, unverified
from .spec import DTYPES, FleetTarget, Lane, Matrix

__all__ = ["SCHEMA_VERSION", "Assumption", "TargetResult", "envelope", "loaded_plugins", "plan_device", "plan_target"]

# Bumped on any change to the meaning or shape of the JSON (goldens carry it too).
SCHEMA_VERSION = 3
CORE = "xbackend"


@dataclass(frozen=True)
class Assumption:
    impl: str  # "backend:impl"
    reason: str  # why this host's availability check failed
    target: str

    def to_dict(self) -> dict[str, str]:
        return {"impl": self.impl, "reason": self.reason, "note": f"assumed available on {self.target}"}


@dataclass(frozen=True)
class TargetResult:
    target: str
    device: Device
    deployed: bool  # True: availability assumed on the target; False: this host's real availability
    plans: tuple[Plan, ...]
    assumed: tuple[Assumption, ...] = ()
    count: int | None = None
    lanes: tuple[Lane, ...] = ()
    unverified: tuple[Unverified, ...] = ()
    where: str = ""  # for a real device: the torch devices it stands for ("cuda:0-7")
    plugins: tuple[str, ...] = ()  # the plugins its plans were made with (loaded_plugins)
    kernels: tuple[dict[str, Any], ...] | None = None  # --compile's records
    compile_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target,
            "device": device_dict(self.device),
            "planned_as": "deployed" if self.deployed else "host",
            "plugins": list(self.plugins),
        }
        if self.where:
            out["where"] = self.where
        if self.count is not None:
            out["count"] = self.count
        out["lanes"] = [{"name": lane.name, "torch": lane.torch, "triton": lane.triton} for lane in self.lanes]
        out["assumed"] = [a.to_dict() for a in self.assumed]
        out["unverified"] = [u.to_dict() for u in self.unverified]
        out["plans"] = [p.to_dict() for p in self.plans]
        if self.kernels is not None or self.compile_error is not None:
            out["kernels"] = list(self.kernels) if self.kernels is not None else None
            out["compile_error"] = self.compile_error
        return out


def device_dict(device: Device) -> dict[str, Any]:
    return {"vendor": device.vendor, "arch": device.arch, "name": device.name, "simulated": device.simulated}


def loaded_plugins(rt: Any) -> tuple[str, ...]:
    """The plugins ``rt`` loaded and registered (none refused, blocked or failed), sorted by name."""
    return tuple(sorted(name for name, status in rt.plugins.items()
                        if status.error is None and rt.pm.get_plugin(name) is not None))


@contextlib.contextmanager
def _planning_with(rt: Any) -> Iterator[None]:
    """``xbackend.plan`` answers from the process runtime: make it ``rt`` while a target is planned."""
    from .._runtime import current, set_runtime

    if current() is rt:
        yield
        return
    previous = set_runtime(rt)
    try:
        yield
    finally:
        set_runtime(previous)


def _impls(rt: Any, ops: tuple[str, ...]) -> dict[str, Impl]:
    return {i.qualname: i for op in ops for i in rt.candidates(op)}


def _assumptions(rt: Any, target: str, device: Device, ops: tuple[str, ...]) -> tuple[Assumption, ...]:
    """Impls that run on ``device`` but whose availability check fails on this host."""
    blocked = getattr(rt, "blocked", frozenset())
    found = {}
    for qualname, impl in _impls(rt, ops).items():
        if impl.backend == CORE or not impl.runs_on(device) or {impl.backend, impl.name, qualname} & blocked:
            continue
        reason = rt.availability(impl)
        if reason is not None:
            found[qualname] = Assumption(qualname, reason, target)
    return tuple(found[k] for k in sorted(found))


def _plans(device: Device, matrix: Matrix, deployed: bool) -> tuple[Plan, ...]:
    return tuple(
        plan(op, device, dtype=DTYPES[dtype], quality=quality, assume_available=deployed)
        for op in matrix.ops for dtype in matrix.dtypes for quality in matrix.qualities
    )


def plan_device(rt: Any, target: str, device: Device, matrix: Matrix, *, deployed: bool | None = None,
                count: int | None = None, lanes: tuple[Lane, ...] = (), where: str = "") -> TargetResult:
    """Every plan of ``matrix`` on one device; ``deployed`` defaults to "simulated targets as deployed,
    real devices with their real availability"."""
    deployed = device.simulated if deployed is None else deployed
    with _planning_with(rt):
        plans = _plans(device, matrix, deployed)
    assumed = _assumptions(rt, target, device, matrix.ops) if deployed else ()
    flags = unverified(plans, lanes, _impls(rt, matrix.ops), device.arch)
    return TargetResult(target, device, deployed, plans, assumed, count, lanes, flags, where, loaded_plugins(rt))


def plan_target(rt: Any, target: FleetTarget, matrix: Matrix, *, deployed: bool | None = None) -> TargetResult:
    return plan_device(rt, target.name, rt.device(target.name), matrix, deployed=deployed, count=target.count,
                       lanes=target.lanes)


def local_devices(rt: Any) -> list[tuple[Device, str]]:
    """This host's devices, one per distinct GPU model (eight H200s plan once), with the torch
    devices each stands for; the CPU when torch sees no GPU."""
    if not torch.cuda.is_available():
        return [(rt.device(torch.device("cpu")), "cpu")]
    groups: dict[tuple[str, str, str], list[int]] = {}
    first: dict[tuple[str, str, str], Device] = {}
    for i in range(torch.cuda.device_count()):
        dev = rt.device(torch.device("cuda", i))
        key = (dev.vendor, dev.arch, dev.name)
        groups.setdefault(key, []).append(i)
        first.setdefault(key, dev)
    out = []
    for key, indices in groups.items():
        span = str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"
        if len(indices) > 1 and indices != list(range(indices[0], indices[-1] + 1)):
            span = ",".join(map(str, indices))
        out.append((first[key], f"cuda:{span}"))
    return out


def plan_local(rt: Any, matrix: Matrix, *, preferred: tuple[str, ...] = (), deployed: bool = False,
               runtime_for: Callable[[str], Any] | None = None) -> list[TargetResult]:
    """This host's devices planned with their real availability, each as the target it probes as;
    with ``preferred`` (the targets that have a golden), a device whose name matches none of them but
    whose arch does stands for its arch. ``runtime_for(target)``: the runtime that plans it (``rt``)."""
    from .._device import probed_target

    results = []
    for device, where in local_devices(rt):
        target = probed_target(device, preferred)
        if preferred and target not in preferred and device.arch in preferred:
            target = device.arch
        planner = runtime_for(target) if runtime_for is not None else rt
        results.append(plan_device(planner, target, device, matrix, deployed=deployed, lanes=(host_lane(),),
                                   where=where))
    return results


# -- the envelope: everything host- and version-specific lives here, never in a golden ---------------


def _dist_of_module(module: str) -> importlib.metadata.Distribution | None:
    top = module.split(".")[0]
    names = importlib.metadata.packages_distributions().get(top, [])
    for name in names:
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _plugin_dists() -> dict[str, tuple[str, str]]:
    out = {}
    for ep in importlib.metadata.entry_points(group="xbackend"):
        dist = getattr(ep, "dist", None)
        if dist is not None:
            out.setdefault(ep.name, (dist.metadata["Name"], dist.version))
    return out


def plugin_records(rt: Any) -> list[dict[str, Any]]:
    dists = _plugin_dists()
    records = []
    for name in sorted(rt.plugins):
        status = rt.plugins[name]
        # An entry point's own distribution: another one's entry point may share its name.
        dist = (status.distribution, status.version) if getattr(status, "distribution", None) else dists.get(name)
        if dist is None:
            obj = rt.pm.get_plugin(name)
            module = getattr(obj, "__name__", None) if isinstance(getattr(obj, "__name__", None), str) else None
            found = _dist_of_module(module or type(obj).__module__) if obj is not None else None
            dist = (found.metadata["Name"], found.version) if found is not None else None
        error = status.error
        state = "loaded" if error is None else ("blocked" if error.startswith("blocked") else "failed")
        records.append({
            "name": name,
            "distribution": dist[0] if dist else None,
            "version": dist[1] if dist else None,
            "source": status.source,
            "status": state,
            "error": error,
            "impls": len(status.impls),
        })
    return records


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_record() -> dict[str, Any]:
    if torch.version.hip:
        build = f"ROCm {torch.version.hip}"
    else:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "torch": torch.__version__,
        "torch_build": build,
        "triton": host_lane().triton,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def impl_records(rt: Any, ops: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"op": i.op, "impl": i.qualname, "verified_on": [list(p) for p in i.verified_on]}
            for op in ops for i in rt.candidates(op) if i.backend != CORE]


@dataclass(frozen=True)
class Envelope:
    command: str
    matrix: Matrix
    results: tuple[TargetResult, ...]
    problems: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def envelope(rt: Any, env: Envelope) -> dict[str, Any]:
    """The ``--json`` document: schema version, versions, plugin status, then per target its plans."""
    import xbackend

    return {
        "schema_version": SCHEMA_VERSION,
        "command": env.command,
        "xbackend": xbackend.__version__,
        "host": host_record(),
        "plugins": plugin_records(rt),
        "problems": list(env.problems),
        "matrix": env.matrix.to_dict(),
        "impls": impl_records(rt, env.matrix.ops),
        "targets": [r.to_dict() for r in env.results],
        **env.extra,
    }


def default_matrix() -> Matrix:
    return Matrix(tuple(kernel_ops()))
