"""The runtime: plugins, registry, per-key dispatch cache, the first-use guard, and reports.

Hot path (``dispatch``): build the runtime key from shapes/strides/dtypes/devices (in C++ where
``_fastkey`` decided so), one dict lookup, call the verified impl. Everything else (checks, probing,
resolution, verification) happens once per key, under a per-key lock, so eight threads hitting the
same first use see one verification.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy
import torch

from . import _fastkey, hookspecs
from ._device import Device, probe, simulated
from ._opspec import OpSpec, describe_args
from ._policy import _POLICY, Policy
from ._precision import EXACT, Output
from ._registry import Impl, Registrar, Registry
from ._resolver import Context, Decision, decide
from .ops import OPS

log = logging.getLogger("xbackend")

ENTRY_POINT_GROUP = "xbackend"
CORE = "xbackend"
REFERENCE = "reference"
_MAX_KEYS = 4096  # per policy; shapes churn in some servers, so the cache must not grow unbounded


class ImplUnusableError(RuntimeError):
    """A forced impl (``xbackend.use``) cannot take this call."""


def _env_list(name: str) -> frozenset[str]:
    return frozenset(p.strip() for p in os.environ.get(name, "").split(",") if p.strip())


@dataclass
class PluginStatus:
    name: str
    source: str  # "entry point <value>", "explicit"
    error: str | None = None
    impls: list[str] = field(default_factory=list)


@dataclass
class Event:
    op: str
    key: str
    impl: str
    status: str  # "verified", "mismatch", "raised", "unverified", "reference"
    detail: str = ""


class _Entry:
    """Dispatch state of one (policy, runtime key)."""

    __slots__ = ("decisions", "described", "device", "disabled", "fn", "forced", "impl", "lock")

    def __init__(self, decisions: list[Decision], described: str, device: Device, forced: str | None) -> None:
        self.fn: Any = None  # the verified callable, once there is one
        self.impl: Impl | None = None  # whose callable that is
        self.decisions = decisions
        self.lock = threading.Lock()
        self.disabled: dict[str, str] = {}
        self.described = described
        self.device = device
        self.forced = forced


class Runtime:
    """Plugin manager + registry + dispatch state. One per process (``xbackend.runtime()``); tests
    make fresh ones (``xbackend.testing.fresh_runtime``)."""

    def __init__(
        self,
        plugins: Iterable[object | tuple[str, object]] = (),
        *,
        autoload: bool | None = None,
        block: Iterable[str] | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager(CORE)
        self.pm.add_hookspecs(hookspecs)
        self.blocked = frozenset(block) if block is not None else _env_list("XBACKEND_BLOCK")
        self.plugins: dict[str, PluginStatus] = {}
        if autoload is None:
            autoload = os.environ.get("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
        self._load_entry_points(None if autoload else _env_list("XBACKEND_PLUGINS"))
        for plugin in plugins:
            name, obj = plugin if isinstance(plugin, tuple) else (getattr(plugin, "__name__", repr(plugin)), plugin)
            self._add_plugin(name, obj, "explicit")
        self.registry = Registry(OPS)
        self._register_all()
        self._references = {name: Impl(op=name, name=REFERENCE, fn=spec.reference, priority=-(2**31), precision=EXACT,
                                       description="eager PyTorch reference", backend=CORE) for name, spec in OPS.items()}
        self._caches: dict[Policy, dict[Any, _Entry]] = {}
        self._lock = threading.Lock()
        self._devices: dict[tuple[str, int | None], Device] = {}
        self._available: dict[Impl, str | None] = {}
        self.events: list[Event] = []
        self._logged: set[tuple[str, str, str]] = set()

    # -- plugins ---------------------------------------------------------------------------------
    def _load_entry_points(self, only: frozenset[str] | None) -> None:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (only is not None and ep.name not in only) or ep.name in self.plugins:
                continue
            if ep.name in self.blocked:
                self.plugins[ep.name] = PluginStatus(ep.name, f"entry point {ep.value}", "blocked by XBACKEND_BLOCK")
                continue
            try:
                obj = ep.load()
            except Exception as e:
                self.plugins[ep.name] = PluginStatus(ep.name, f"entry point {ep.value}", f"import failed: {type(e).__name__}: {e}")
                log.warning("xbackend: plugin %r failed to import and was skipped: %s: %s", ep.name, type(e).__name__, e)
                continue
            self._add_plugin(ep.name, obj, f"entry point {ep.value}")

    def _add_plugin(self, name: str, obj: object, source: str) -> None:
        if name in self.blocked:
            self.plugins[name] = PluginStatus(name, source, "blocked by XBACKEND_BLOCK")
            return
        try:
            self.pm.register(obj, name=name)
        except Exception as e:
            self.plugins[name] = PluginStatus(name, source, f"register failed: {type(e).__name__}: {e}")
            return
        self.plugins[name] = PluginStatus(name, source)

    def _register_all(self) -> None:
        for hookimpl in self.pm.hook.xbackend_register_impls.get_hookimpls():
            name = hookimpl.plugin_name
            registrar = Registrar(self.registry, name)
            snapshot = self.registry.snapshot()
            try:
                hookimpl.function(*[{"registrar": registrar}[a] for a in hookimpl.argnames])
            except Exception as e:
                self.registry.restore(snapshot)
                status = self.plugins.setdefault(name, PluginStatus(name, "explicit"))
                status.error = f"registration failed: {type(e).__name__}: {e}"
                log.warning("xbackend: plugin %r failed to register and was skipped: %s", name, status.error)
                continue
            self.plugins.setdefault(name, PluginStatus(name, "explicit")).impls = [f"{i.op}:{i.name}" for i in registrar.added]

    # -- devices ---------------------------------------------------------------------------------
    def device(self, where: torch.device | str | Device) -> Device:
        """A probed device (``torch.device``/"cuda:1") or a simulated target ("sm100", "mi350x")."""
        if isinstance(where, Device):
            return where
        if isinstance(where, str):
            try:
                where = torch.device(where)
            except RuntimeError:
                extra: dict[str, Device] = {}
                for found in self.pm.hook.xbackend_simulated_targets():
                    extra |= found or {}
                return simulated(where, extra)
        index = where.index
        if where.type == "cuda" and index is None:
            index = torch.cuda.current_device()
        cache_key = (where.type, index)
        dev = self._devices.get(cache_key)
        if dev is None:
            normalized = torch.device(where.type, index) if index is not None else torch.device(where.type)
            dev = self.pm.hook.xbackend_probe_device(device=normalized) or probe(normalized)
            self._devices[cache_key] = dev
        return dev

    def availability(self, impl: Impl) -> str | None:
        if impl.available is None:
            return None
        if impl not in self._available:
            try:
                self._available[impl] = impl.available()
            except Exception as e:  # e.g. `import aiter` raises RuntimeError off ROCm
                self._available[impl] = f"{type(e).__name__}: {e}"
        return self._available[impl]

    # -- resolution ------------------------------------------------------------------------------
    def candidates(self, op: str) -> list[Impl]:
        return self.registry.impls(op) + [self._references[op]]

    def decide(self, spec: OpSpec, args: tuple[Any, ...], device: Device, policy: Policy,
               disabled: dict[str, str] | None = None, assume_available: bool = False) -> list[Decision]:
        tier, forced_pairs = policy
        forced = dict(forced_pairs).get(spec.name)
        ctx = Context(spec, args, device, tier, forced, self.blocked - {CORE}, disabled or {},
                      (lambda impl: None) if assume_available else self.availability)
        decisions = decide(self.candidates(spec.name), ctx)
        if forced is not None:
            self._check_forced(spec, forced, decisions)
        return decisions

    def _check_forced(self, spec: OpSpec, forced: str, decisions: list[Decision]) -> None:
        match = [d for d in decisions if forced in (d.impl.name, d.impl.qualname)]
        if not match:
            names = ", ".join(d.impl.qualname for d in decisions)
            raise ImplUnusableError(f"{spec.name}: use({spec.name}={forced!r}) names no registered impl; registered: {names}")
        if all(d.reason is not None for d in match):
            reasons = "; ".join(f"{d.impl.qualname}: {d.reason}" if len(match) > 1 else d.reason for d in match)
            raise ImplUnusableError(f"{spec.name}: forced impl {forced!r} cannot run this call: {reasons}")

    # -- dispatch --------------------------------------------------------------------------------
    def dispatch(self, spec: OpSpec, args: tuple[Any, ...]) -> Output:
        policy = _POLICY.get()
        cache = self._caches.get(policy)
        if cache is None:
            _fastkey.decide()  # the key form is fixed before the first cache exists (once per process)
            cache = self._caches.setdefault(policy, {})
        try:
            # Starts with the op's name, so one cache serves every op. The same function as Op._key.
            key = _fastkey.KEYS.get(spec.name, spec.key)(*args)
        except Exception:
            spec.check(*args)  # a non-tensor where a tensor belongs: raise the op's clear error
            raise
        entry = cache.get(key)
        if entry is None:
            entry = self._new_entry(spec, args, policy, cache, key)
        fn = entry.fn
        if fn is not None:
            try:
                return fn(*args)
            except Exception as e:
                return self._after_failure(spec, entry, args, e)
        return self._first_use(spec, entry, args)

    def _new_entry(self, spec: OpSpec, args: tuple[Any, ...], policy: Policy, cache: dict[Any, _Entry], key: Any) -> _Entry:
        spec.check(*args)
        device = self.device(spec.device_of(args))
        decisions = self.decide(spec, args, device, policy)
        entry = _Entry(decisions, describe_args(args), device, dict(policy[1]).get(spec.name))
        with self._lock:
            if len(cache) >= _MAX_KEYS:
                cache.clear()
            return cache.setdefault(key, entry)

    def _first_use(self, spec: OpSpec, entry: _Entry, args: tuple[Any, ...]) -> Output:
        with entry.lock:
            if entry.fn is not None:  # another thread verified it while we waited
                return entry.fn(*args)
            for decision in entry.decisions:
                impl = decision.impl
                if decision.reason is not None or impl.qualname in entry.disabled:
                    continue
                if impl.backend == CORE:
                    entry.fn, entry.impl = impl.fn, impl
                    self._event(spec, entry, impl, "reference")
                    return impl.fn(*args)
                if _cannot_verify_now(args, spec):
                    # A CUDA graph capture or a compile trace is no place to compare (it would sync);
                    # run the reference now and verify on a later eager call.
                    self._event(spec, entry, impl, "unverified", "first use during capture/trace; ran the reference")
                    return spec.reference(*args)
                try:
                    fn = impl.resolved("fn")
                    out = fn(*args)
                    reason = spec.check_output(out, args, impl.precision)
                    status = "mismatch"
                except Exception as e:
                    reason, status = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", "raised"
                if reason is None:
                    entry.fn, entry.impl = fn, impl
                    self._event(spec, entry, impl, "verified", str(impl.precision))
                    return out
                self._disable(spec, entry, impl, status, reason)
            raise AssertionError(f"{spec.name}: no candidate left, not even the reference")  # unreachable

    def _after_failure(self, spec: OpSpec, entry: _Entry, args: tuple[Any, ...], error: Exception) -> Output:
        with entry.lock:
            failed = entry.impl
            if failed is None or failed.backend == CORE:
                raise error  # the reference itself failed: the caller's problem, surface it
            entry.fn = entry.impl = None
            self._disable(spec, entry, failed, "raised", f"{type(error).__name__}: {error}")
        return self._first_use(spec, entry, args)

    def _disable(self, spec: OpSpec, entry: _Entry, impl: Impl, status: str, reason: str) -> None:
        entry.disabled[impl.qualname] = reason
        self._event(spec, entry, impl, status, reason)
        if entry.forced is not None:
            raise ImplUnusableError(f"{spec.name}: forced impl {impl.qualname!r} failed its check on {entry.described}: {reason}")
        log.warning("xbackend: %s impl %s %s on %s (%s); falling back", spec.name, impl.qualname,
                    "failed verification" if status == "mismatch" else "raised", entry.described, reason)

    def _event(self, spec: OpSpec, entry: _Entry, impl: Impl, status: str, detail: str = "") -> None:
        self.events.append(Event(spec.name, entry.described, impl.qualname, status, detail))


def _cannot_verify_now(args: tuple[Any, ...], spec: OpSpec) -> bool:
    if torch.compiler.is_compiling():
        return True
    device = spec.device_of(args)
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_current: Runtime | None = None
_current_lock = threading.Lock()


def runtime() -> Runtime:
    """The process-wide runtime, created on first use."""
    global _current
    if _current is None:
        with _current_lock:
            if _current is None:
                _current = Runtime()
    return _current


def set_runtime(rt: Runtime | None) -> Runtime | None:
    """Swap the process-wide runtime (tests); returns the previous one."""
    global _current
    previous, _current = _current, rt
    return previous


def dispatch(spec: OpSpec, args: tuple[Any, ...]) -> Output:
    return (_current or runtime()).dispatch(spec, args)
