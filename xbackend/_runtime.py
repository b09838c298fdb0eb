"""The runtime: registry, per-key dispatch cache, the guard's bookkeeping, and reports (plugin loading
is ``_plugins``; the guard's isolated call, ``_guard``).

Hot path (``dispatch``): build the runtime key from shapes/strides/dtypes/devices and data-pointer
alignment classes (in C++ where ``_fastkey`` decided so), one dict lookup, call the verified impl.
Everything else (checks, probing, resolution, verification) happens once per key, under a per-key
lock, so eight threads hitting the same first use see one verification. An impl that raises after
verification is disabled for its key and every caller that saw it raise takes the next candidate; the
reference's own errors reach the caller.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from . import _fastkey
from ._active import current, dispatch, runtime, set_default, set_runtime
from ._device import Device, device_families, probe, simulated
from ._guard import (
    GUARD_SIGNALS,
    FallbackWarning,
    ImplUnusableError,
    ReferenceFailed,
    VerifyMode,
    cannot_verify_now,
    isolated_call,
)
from ._opspec import OpSpec, describe_args
from ._plugins import CORE, ENTRY_POINT_GROUP, RESERVED_PLUGINS, Plugins, PluginStatus, env_flag, env_list
from ._policy import _POLICY, REFERENCE, Policy
from ._precision import EXACT, Output
from ._registry import Impl, Registry
from ._resolver import Context, Decision, decide
from .ops import OPS

# The plugin names (CORE, ENTRY_POINT_GROUP, ...) are _plugins'; they stay importable from here.
__all__ = ["CORE", "ENTRY_POINT_GROUP", "RESERVED_PLUGINS", "Event", "ImplUnusableError", "PluginStatus", "Runtime",
           "current", "dispatch", "env_flag", "env_list", "runtime", "set_runtime"]

log = logging.getLogger("xbackend")

_MAX_KEYS = 4096  # per policy; shapes churn in some servers, so the cache must not grow unbounded
_MAX_EVENTS = 4096  # report() keeps the latest events; the count of older ones is kept
# A torch.OutOfMemoryError is retried once after emptying the allocator's cache; an impl is disabled
# for a key only after this many retries ran out of memory too, with no successful retry between.
OOM_STRIKES = 3
_PRIORITY_FLOOR = -(2**31)  # the reference's priority: below anything a plugin can register

@dataclass
class Event:
    op: str
    key: str
    impl: str
    # "verified", "mismatch", "raised", "unverified", "reference", "transient", "rechecked"
    status: str
    detail: str = ""


class _Entry:
    """Dispatch state of one (policy, runtime key)."""

    __slots__ = ("calls", "decisions", "described", "device", "disabled", "fn", "forced", "impl", "lock", "mode",
                 "strikes")

    def __init__(self, decisions: list[Decision], described: str, device: Device, forced: str | None,
                 mode: VerifyMode) -> None:
        self.fn: Any = None  # what calls run once verified: the impl's callable, or its checking wrapper
        self.impl: Impl | None = None  # whose callable that is
        self.decisions = decisions
        self.lock = threading.Lock()
        self.disabled: dict[str, str] = {}
        self.described = described
        self.device = device
        self.forced = forced
        self.mode = mode
        self.calls = itertools.count(1)  # calls since verification (sample:N); next() is atomic in CPython
        self.strikes: dict[str, int] = {}  # impl qualname -> retries that ran out of memory too


class Runtime:
    """Plugin manager + registry + dispatch state. One per process (``xbackend.runtime()``); tests
    make fresh ones (``xbackend.testing.fresh_runtime``). ``entry_points`` names the entry-point
    plugins to load, in place of autoload and ``XBACKEND_PLUGINS``."""

    def __init__(
        self,
        plugins: Iterable[object | tuple[str, object]] = (),
        *,
        autoload: bool | None = None,
        block: Iterable[str] | None = None,
        entry_points: Iterable[str] | None = None,
    ) -> None:
        loaded = Plugins(plugins, autoload=autoload, block=block, entry_points=entry_points)
        self.pm, self.blocked, self.plugins = loaded.pm, loaded.blocked, loaded.status
        # Load-time problems (unknown names, refused plugins, bad environment values), one line each.
        self.problems: list[str] = loaded.problems
        self.notes: list[str] = loaded.notes  # no problem, but explains every plan (e.g. no backend loaded)
        # Device families first: plugins' impls name their arches (Impl validates its devices when made).
        self.families = loaded.device_families()
        self.registry = Registry(OPS)
        with device_families(self.families):
            loaded.register_impls(self.registry)
        self._references = {name: Impl(op=name, name=REFERENCE, fn=spec.reference, priority=_PRIORITY_FLOOR,
                                       precision=EXACT, description="eager PyTorch reference", backend=CORE)
                            for name, spec in OPS.items()}
        loaded.check_names(self.registry)
        self._caches: dict[Policy, dict[Any, _Entry]] = {}
        self._lock = threading.Lock()
        self._devices: dict[tuple[str, int | None], Device] = {}
        self._available: dict[Impl, str | None] = {}
        self.events: collections.deque[Event] = collections.deque(maxlen=_MAX_EVENTS)
        self.events_total = 0  # events ever recorded; the deque keeps the latest _MAX_EVENTS
        # Kernel launch-path switches as this runtime first read them (``_switches.switch``): fixed for
        # its life, so a verified key keeps the path its verification ran.
        self.switches: dict[str, bool] = {}

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
        visible = where.type != "cuda" or torch.cuda.is_available()
        if where.type == "cuda" and index is None:
            index = torch.cuda.current_device() if visible else 0
        cache_key = (where.type, index)
        dev = self._devices.get(cache_key)
        if dev is None:
            normalized = torch.device(where.type, index) if index is not None else torch.device(where.type)
            dev = self.pm.hook.xbackend_probe_device(device=normalized)
            if dev is None:
                if not visible or (where.type == "cuda" and index >= torch.cuda.device_count()):
                    raise ValueError(
                        f"device {str(normalized)!r} is not visible here (torch.cuda.is_available() is "
                        f"{torch.cuda.is_available()}, {torch.cuda.device_count()} device(s)); to plan for a GPU this "
                        f"machine lacks, name a target instead (h100, h200, b200, mi300x, sm90, gfx950, ...)")
                dev = probe(normalized)
            self._devices[cache_key] = dev
        return dev

    def availability(self, impl: Impl) -> str | None:
        """None when ``impl`` can run on this host, else why not: its ``available()`` says so, or its
        ``fn`` (a "module:function" string) does not import. ``available()`` is asked first: it names
        the missing dependency ("triton is not installed") that an ``fn`` import would only fail on.
        Checked once per impl."""
        if impl.available is None and not isinstance(impl.fn, str):
            return None
        if impl not in self._available:
            reason = None
            if impl.available is not None:
                try:
                    reason = impl.available()
                except Exception as e:  # e.g. `import aiter` raises RuntimeError off ROCm
                    reason = f"{type(e).__name__}: {e}"
            if reason is None and isinstance(impl.fn, str):
                try:
                    impl.resolved("fn")
                except Exception as e:
                    reason = f"cannot import fn {impl.fn!r}: {type(e).__name__}: {e}"
            self._available[impl] = reason
        return self._available[impl]

    # -- resolution ------------------------------------------------------------------------------
    def candidates(self, op: str) -> list[Impl]:
        return self.registry.impls(op) + [self._references[op]]

    def load_problems(self) -> list[str]:
        """Every load-time problem, one line each: plugins refused or failed to import or register
        (a plugin blocked on purpose is none), then unknown names and bad environment values."""
        lines = []
        for name in sorted(self.plugins):
            error = self.plugins[name].error
            reported = any(p.startswith(f"plugin {name!r}") for p in self.problems)
            if error is not None and not error.startswith("blocked") and not reported:
                lines.append(f"plugin {name!r} failed to load: {error} (fix or uninstall it, or block it "
                             f"with XBACKEND_BLOCK={name})")
        return lines + list(self.problems)

    def reference(self, op: str) -> Impl:
        """The op's reference as an impl record (``xbackend:reference``)."""
        return self._references[op]

    def decide(self, spec: OpSpec, args: tuple[Any, ...], device: Device, policy: tuple[Any, ...],
               disabled: dict[str, str] | None = None, assume_available: bool = False) -> list[Decision]:
        tier, forced_pairs = policy[0], policy[1]
        forced = dict(forced_pairs).get(spec.name)
        ctx = Context(spec, args, device, tier, forced, self.blocked, disabled or {},
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
    def lookup(self, key: Any) -> Callable[..., Output] | None:
        """The callable a cached call with runtime ``key`` runs under the current policy, or None
        (no runtime key yet, or not verified yet). The hot path of ``Op.__call__``."""
        cache = self._caches.get(_POLICY.get())
        entry = cache.get(key) if cache is not None else None
        return entry.fn if entry is not None else None

    def dispatch(self, spec: OpSpec, args: tuple[Any, ...]) -> Output:
        policy = _POLICY.get()
        cache = self._caches.get(policy)
        if cache is None:
            _fastkey.decide()  # the key form is fixed before the first cache exists (once per process)
            cache = self._caches.setdefault(policy, {})
        try:
            # Starts with the op's name, so one cache serves every op. The same function as Op._key.
            key = _fastkey.KEYS.get(spec.name, spec.key)(*args)
            entry = cache.get(key)
        except Exception:
            # A non-tensor where a tensor belongs, an unhashable argument: raise the op's clear error.
            spec.check(*args)
            raise
        if entry is None:
            entry = self._new_entry(spec, args, policy, cache, key)
        fn = entry.fn
        if fn is not None:
            try:
                return fn(*args)
            except GUARD_SIGNALS:
                raise
            except Exception as e:
                return self.after_failure(spec, key, args, e, fn)
        return self._first_use(spec, entry, args)

    def _new_entry(self, spec: OpSpec, args: tuple[Any, ...], policy: Policy, cache: dict[Any, _Entry], key: Any) -> _Entry:
        spec.check(*args)
        device = self.device(spec.device_of(args))
        decisions = self.decide(spec, args, device, policy)
        entry = _Entry(decisions, describe_args(args), device, dict(policy[1]).get(spec.name), policy[2])
        with self._lock:
            if len(cache) >= _MAX_KEYS:
                cache.clear()
            return cache.setdefault(key, entry)

    def _entry(self, key: Any) -> _Entry | None:
        cache = self._caches.get(_POLICY.get())
        return cache.get(key) if cache is not None else None

    def _first_use(self, spec: OpSpec, entry: _Entry, args: tuple[Any, ...]) -> Output:
        """Resolve and verify under the entry's lock, or run what another thread verified meanwhile."""
        if entry in _resolving():
            # The candidate under verification called its own op with the same key: no answer for
            # it exists yet, and waiting on this entry's lock would wait on this very thread.
            raise RuntimeError(f"{spec.name}: an impl called {spec.name} on the same inputs during its own "
                               f"verification (impls must not re-enter their op)")
        with entry.lock:
            fn = entry.fn
            if fn is None:
                _resolving().add(entry)
                try:
                    return self._resolve(spec, entry, args)
                finally:
                    _resolving().discard(entry)
        try:
            return fn(*args)
        except GUARD_SIGNALS:
            raise
        except Exception as e:
            return self._failed(spec, entry, args, e, fn)

    def _resolve(self, spec: OpSpec, entry: _Entry, args: tuple[Any, ...]) -> Output:
        """Try the candidates in order (caller holds ``entry.lock``): the first that passes its check
        becomes the entry's callable; its output (computed on copies of the inputs) is the answer."""
        reference = self._references[spec.name]
        transient = False  # a candidate ran out of memory: answer this call, cache nothing
        for decision in entry.decisions:
            impl = decision.impl
            if decision.reason is not None or impl.qualname in entry.disabled:
                continue
            if impl is reference:
                if not transient:
                    entry.fn, entry.impl = impl.fn, impl
                    self._event(spec, entry, impl, "reference")
                return impl.fn(*args)
            why = cannot_verify_now(args, spec)
            if why is not None:  # run the reference now and verify on a later call that can compare
                self._event(spec, entry, impl, "unverified", f"{why}; ran the reference")
                return spec.reference(*args)
            out, status, reason, fn = self._check(spec, impl, args)
            if status == "verified":
                if not transient:
                    entry.impl, entry.fn = impl, self._runner(spec, entry, impl, fn)
                entry.strikes.pop(impl.qualname, None)
                self._event(spec, entry, impl, "verified", str(impl.precision))
                return out
            if status == "transient" and self._strike(spec, entry, impl, reason):
                transient = True
                continue
            self._disable(spec, entry, impl, status, reason)
        if entry.forced is not None:  # every candidate but the forced one is ruled out by use()
            why = "; ".join(f"{name}: {r}" for name, r in entry.disabled.items())
            raise ImplUnusableError(f"{spec.name}: forced impl {entry.forced!r} cannot run {entry.described}: {why}")
        raise AssertionError(f"{spec.name}: no candidate left, not even the reference")  # the reference is never disabled

    def _check(self, spec: OpSpec, impl: Impl, args: tuple[Any, ...]) -> tuple[Any, str, str, Any]:
        """One verification call of ``impl``: (output, status, reason, callable). Status "verified",
        "mismatch", "raised" or "transient" (out of memory twice, the second time after emptying the
        allocator's cache)."""
        fn = None
        for attempt in (1, 2):
            try:
                fn = impl.resolved("fn")
                out, reason = isolated_call(fn, args, spec.tensor_args, spec.arg_names)
            except torch.OutOfMemoryError as e:
                if attempt == 2:
                    return None, "transient", _one_line(e), fn
                _empty_cache(spec.device_of(args))
                continue
            except Exception as e:
                return None, "raised", _one_line(e), fn
            if reason is None:
                # The reference runs here, on the caller's tensors: its errors are the caller's
                # (a real out-of-memory, bad input its checks let through), never the candidate's.
                reason = spec.check_output(out, args, impl.precision)
            return out, ("verified" if reason is None else "mismatch"), reason or "", fn
        raise AssertionError("unreachable")

    def _runner(self, spec: OpSpec, entry: _Entry, impl: Impl, fn: Callable[..., Output]) -> Callable[..., Output]:
        """What the entry calls from now on: the impl itself (``first``), or a wrapper that checks every
        call (``always``) or one call in N (``sample:N``)."""
        mode = entry.mode
        if mode.kind == "first":
            return fn
        every = 1 if mode.kind == "always" else mode.every
        calls = entry.calls

        def checked(*args: Any) -> Output:
            if next(calls) % every or cannot_verify_now(args, spec):
                return fn(*args)
            try:
                out, status, reason, _ = self._check(spec, impl, args)
            except Exception as e:  # only the reference's comparison raises out of _check
                raise ReferenceFailed from e
            if status == "verified":
                return out
            return self._recheck_failed(spec, entry, impl, checked, args, status, reason)

        return checked

    def _recheck_failed(self, spec: OpSpec, entry: _Entry, impl: Impl, runner: Any, args: tuple[Any, ...],
                        status: str, reason: str) -> Output:
        with entry.lock:
            if entry.fn is runner:
                if status == "transient" and self._strike(spec, entry, impl, reason):
                    return spec.reference(*args)
                entry.fn = entry.impl = None
                self._disable(spec, entry, impl, status, f"on a later call ({entry.mode}): {reason}")
        return self._first_use(spec, entry, args)

    def after_failure(self, spec: OpSpec, key: Any, args: tuple[Any, ...], error: Exception, fn: Any) -> Output:
        """``fn``, the cached callable for runtime ``key``, raised ``error``: disable it for the key and
        answer with the next candidate. The reference's own errors reach the caller."""
        entry = self._entry(key)
        if entry is None:  # the cache was cleared meanwhile: resolve from scratch
            return self.dispatch(spec, args)
        return self._failed(spec, entry, args, error, fn)

    def _failed(self, spec: OpSpec, entry: _Entry, args: tuple[Any, ...], error: Exception, fn: Any) -> Output:
        if isinstance(error, ReferenceFailed):
            raise error.__cause__ from None
        retry = False
        with entry.lock:
            if entry.fn is fn:  # the first thread to see this callable fail handles it; the others retry
                failed = entry.impl
                if failed is None or failed is self._references[spec.name]:
                    raise error  # the reference itself failed: the caller's problem, surface it
                if isinstance(error, torch.OutOfMemoryError):
                    retry = True
                else:
                    entry.fn = entry.impl = None
                    self._disable(spec, entry, failed, "raised", _one_line(error))
        if retry:
            _empty_cache(spec.device_of(args))
            try:
                out = fn(*args)
            except torch.OutOfMemoryError as again:
                with entry.lock:
                    if entry.fn is fn and entry.impl is not None:
                        if self._strike(spec, entry, entry.impl, _one_line(again)):
                            return spec.reference(*args)  # this call only; the impl keeps its place
                        failed, entry.fn, entry.impl = entry.impl, None, None
                        self._disable(spec, entry, failed, "transient", _one_line(again))
                return self._first_use(spec, entry, args)
            except GUARD_SIGNALS:
                raise
            except ReferenceFailed as e:
                raise e.__cause__ from None
            except Exception as other:
                with entry.lock:
                    if entry.fn is fn and entry.impl is not None:
                        failed, entry.fn, entry.impl = entry.impl, None, None
                        self._disable(spec, entry, failed, "raised", _one_line(other))
                return self._first_use(spec, entry, args)
            if entry.impl is not None:
                entry.strikes.pop(entry.impl.qualname, None)  # the retry ran: start counting again
            return out
        return self._first_use(spec, entry, args)

    def _strike(self, spec: OpSpec, entry: _Entry, impl: Impl, reason: str) -> bool:
        """Count an out-of-memory failure; True while the impl keeps its place (transient)."""
        strikes = entry.strikes[impl.qualname] = entry.strikes.get(impl.qualname, 0) + 1
        if strikes >= OOM_STRIKES:
            return False
        self._event(spec, entry, impl, "transient",
                    f"{reason} ({strikes} of {OOM_STRIKES}; retried after emptying the cache, this call "
                    f"fell back)")
        if entry.forced is not None:  # no fallback for a forced impl, on any call; it keeps its place
            raise ImplUnusableError(f"{spec.name}: forced impl {entry.forced!r} ran out of memory on "
                                    f"{entry.described}: {reason}")
        return True

    def _disable(self, spec: OpSpec, entry: _Entry, impl: Impl, status: str, reason: str) -> None:
        entry.disabled[impl.qualname] = reason
        self._event(spec, entry, impl, status, reason)
        if entry.forced is not None:
            raise ImplUnusableError(f"{spec.name}: forced impl {impl.qualname!r} failed its check on {entry.described}: {reason}")
        what = "failed verification" if status == "mismatch" else ("ran out of memory" if status == "transient" else "raised")
        message = f"xbackend: {spec.name} impl {impl.qualname} {what} on {entry.described} ({reason}); falling back"
        log.warning("%s", message)
        warnings.warn(message, FallbackWarning, stacklevel=2)

    def _event(self, spec: OpSpec, entry: _Entry, impl: Impl, status: str, detail: str = "") -> None:
        self.events.append(Event(spec.name, entry.described, impl.qualname, status, detail))
        self.events_total += 1


_local = threading.local()


def _resolving() -> set[_Entry]:
    """The entries this thread is verifying a candidate for."""
    found = getattr(_local, "entries", None)
    if found is None:
        found = _local.entries = set()
    return found


def _one_line(error: BaseException) -> str:
    text = str(error).splitlines()
    return f"{type(error).__name__}: {text[0]}" if text and text[0] else type(error).__name__


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# The process-wide runtime lives in _active (below the op layer, which dispatches through it); this
# module's Runtime is the one it creates on first use.
set_default(Runtime)
