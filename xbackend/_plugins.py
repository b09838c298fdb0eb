"""Plugin loading: entry points and explicit plugins, reserved names, the blocklist, what each plugin
declared (device families, impls) and the load-time problems, one line each.

The runtime owns one :class:`Plugins`; ``xbackend info`` and ``xbackend.problems()`` show what it found.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import pluggy

from . import hookspecs
from ._cache import warn_once
from ._device import DeviceFamily, families, family_problem
from ._policy import REFERENCE
from ._registry import Registrar, Registry

__all__ = ["CORE", "ENTRY_POINT_GROUP", "RESERVED_PLUGINS", "PluginStatus", "Plugins", "env_flag", "env_list"]

log = logging.getLogger("xbackend")

ENTRY_POINT_GROUP = "xbackend"
CORE = "xbackend"
# Plugin names that belong to this distribution: a third-party entry point named like one of them
# would be taken for the builtin backend (or, for "xbackend", for the reference itself).
RESERVED_PLUGINS = {CORE: None, REFERENCE: None, "cuda": "xbackend_cuda.plugin", "rocm": "xbackend_rocm.plugin"}
_DISTRIBUTION = "xbackend"
NO_BACKEND = ("autoload off and XBACKEND_PLUGINS empty: no backend loaded, every op runs its reference "
              "(name plugins in XBACKEND_PLUGINS, or unset XBACKEND_DISABLE_PLUGIN_AUTOLOAD)")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def env_list(name: str) -> frozenset[str]:
    """A comma-separated environment variable as a set of names."""
    return frozenset(p.strip() for p in os.environ.get(name, "").split(",") if p.strip())


def env_flag(name: str, problems: list[str] | None = None, default: bool = False) -> bool:
    """A boolean environment variable: 1/true/yes/on or 0/false/no/off (any case); unset or empty is
    ``default``. Any other value is ``default`` too, with one warning a value (it may be read at every call)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return default if value == "" else False
    message = f"{name}={raw!r} is not a boolean (1/true/yes/on or 0/false/no/off); taken as {str(default).lower()}"
    warn_once(f"{name}={raw}", f"xbackend: {message}")
    if problems is not None:
        problems.append(message)
    return default


@dataclass
class PluginStatus:
    # The plugin's name, or for an entry point whose name an earlier one (or the builtin backend) holds,
    # "<name>@<distribution>": its refusal never takes the place of the status that name keys.
    name: str
    source: str  # "entry point <value> (<distribution>)", "explicit"
    error: str | None = None
    impls: list[str] = field(default_factory=list)
    distribution: str | None = None  # an entry point's distribution and its version
    version: str | None = None


class Plugins:
    """The plugin manager with every plugin loaded: entry points (all of them, with ``autoload`` off
    those ``XBACKEND_PLUGINS`` names, or exactly those ``entry_points`` names) and then ``explicit``
    ones, less the blocked names."""

    def __init__(self, explicit: Iterable[object | tuple[str, object]] = (), *, autoload: bool | None = None,
                 block: Iterable[str] | None = None, entry_points: Iterable[str] | None = None) -> None:
        self.pm = pluggy.PluginManager(CORE)
        self.pm.add_hookspecs(hookspecs)
        # Load-time problems (unknown names, refused plugins, bad environment values), one line each:
        # logged (once a process for each bad value), listed by ``xbackend info``, fatal under ``--strict``.
        self.problems: list[str] = []
        self.blocked = self._blocklist(block)
        self.status: dict[str, PluginStatus] = {}
        # Facts about what loaded that are no problem but explain every plan (``xbackend info``, ``plan``).
        self.notes: list[str] = []
        explicit = list(explicit)
        # Who chose the entry points to load: the environment, or a caller naming them (``entry_points``:
        # the fleet planning exactly the plugin set a golden records), which the environment does not change.
        self.selected_by = "XBACKEND_PLUGINS" if entry_points is None else "entry_points"
        if entry_points is not None:
            self.only: frozenset[str] | None = frozenset(entry_points)
        else:
            if autoload is None:
                autoload = not env_flag("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", self.problems)
            named = env_list("XBACKEND_PLUGINS")
            if autoload and named:
                self.problem(f"XBACKEND_PLUGINS={','.join(sorted(named))} is ignored: it selects plugins only with "
                             f"XBACKEND_DISABLE_PLUGIN_AUTOLOAD=1, and autoload is on (every installed plugin loads)")
            self.only = None if autoload else named
            if self.only == frozenset() and not explicit:
                self.notes.append(NO_BACKEND)
        self._load_entry_points(self.only)
        for plugin in explicit:
            name, obj = plugin if isinstance(plugin, tuple) else (getattr(plugin, "__name__", repr(plugin)), plugin)
            self._add_plugin(name, obj, "explicit")

    def problem(self, message: str) -> None:
        self.problems.append(message)
        log.warning("xbackend: %s", message)

    def _blocklist(self, block: Iterable[str] | None) -> frozenset[str]:
        names = frozenset(block) if block is not None else env_list("XBACKEND_BLOCK")
        protected = names & {CORE, REFERENCE, f"{CORE}:{REFERENCE}"}
        if protected:
            message = (f"cannot block {', '.join(sorted(protected))}: the reference is the fallback every impl is "
                       f"proven against and always runs")
            if block is not None:
                raise ValueError(f"Runtime(block=...): {message}; remove it")
            self.problem(f"XBACKEND_BLOCK: {message}; ignored")
        return names - protected

    @staticmethod
    def entry_point_names() -> list[str]:
        return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})

    def _load_entry_points(self, only: frozenset[str] | None) -> None:
        # The builtin backends first: an entry point of another distribution that takes their name is
        # then always the one refused, whatever the order of the two on sys.path.
        eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: not _is_builtin(ep))
        seen: set[tuple[str, str]] = set()
        for ep in eps:
            if only is not None and ep.name not in only:
                continue
            dist_obj = getattr(ep, "dist", None)
            dist = getattr(dist_obj, "name", None) or "an unknown distribution"
            source = f"entry point {ep.value} ({dist})"
            if (ep.name, source) in seen:
                continue  # the same distribution found twice on sys.path: one plugin
            seen.add((ep.name, source))
            status = PluginStatus(self._key(ep.name, dist), source, distribution=getattr(dist_obj, "name", None),
                                  version=getattr(dist_obj, "version", None))
            refusal = _reserved_refusal(ep.name, ep.value, dist)
            if refusal is None and status.name != ep.name:
                refusal = (f"refused: the plugin name {ep.name!r} is taken by {self.status[ep.name].source}; "
                           f"one of the two packages must use another entry-point name")
            if refusal is not None:
                status.error = refusal
                self.status[status.name] = status
                self.problem(f"plugin {status.name!r} from {dist}: {refusal}")
            elif ep.name in self.blocked:
                status.error = "blocked by XBACKEND_BLOCK"
                self.status[status.name] = status
            else:
                try:
                    obj = ep.load()
                except Exception as e:
                    status.error = f"import failed: {type(e).__name__}: {e}"
                    self.status[status.name] = status
                    log.warning("xbackend: plugin %r failed to import and was skipped: %s: %s", ep.name,
                                type(e).__name__, e)
                    continue
                self._add_plugin(ep.name, obj, source, status)

    def _key(self, name: str, owner: str) -> str:
        """The status key of a plugin called ``name``: the name itself while no status holds it, else
        ``name@owner`` (numbered when even that is taken)."""
        key, n = name, 1
        while key in self.status:
            n += 1
            key = f"{name}@{owner}" if n == 2 else f"{name}@{owner}#{n - 1}"
        return key

    def _add_plugin(self, name: str, obj: object, source: str, status: PluginStatus | None = None) -> None:
        """Register ``obj`` as ``name``. A plugin is registered only under a name no status holds, so
        the status of a registered plugin is always ``self.status[name]``."""
        if source == "explicit" and name in RESERVED_PLUGINS and (
                RESERVED_PLUGINS[name] is None or getattr(obj, "__name__", None) != RESERVED_PLUGINS[name]):
            raise ValueError(f"Runtime: plugin name {name!r} is reserved for xbackend's own "
                             f"{'reference' if RESERVED_PLUGINS[name] is None else 'builtin backend'}; "
                             f"register this plugin under another name")
        if status is None:
            status = PluginStatus(self._key(name, "explicit"), source)
        if status.name != name:
            status.error = f"register failed: the plugin name {name!r} is taken by {self.status[name].source}"
        elif name in self.blocked:
            status.error = "blocked by XBACKEND_BLOCK"
        else:
            try:
                self.pm.register(obj, name=name)
            except Exception as e:
                status.error = f"register failed: {type(e).__name__}: {e}"
        self.status[status.name] = status

    def device_families(self) -> tuple[DeviceFamily, ...]:
        """The device families the plugins declare (``xbackend_device_families``), in load order. One
        that clashes with a known family, or a hook that raises, is a load-time problem and is left out;
        the plugin's impls that need it then fail to register."""
        found: list[DeviceFamily] = []
        for hookimpl in self.pm.hook.xbackend_device_families.get_hookimpls():
            name = hookimpl.plugin_name
            try:
                declared = list(hookimpl.function() or ())
            except Exception as e:
                self.problem(f"plugin {name!r}: xbackend_device_families raised {type(e).__name__}: {e}")
                continue
            for family in declared:
                problem = family_problem(family, families() + tuple(found))
                if problem is not None:
                    self.problem(f"plugin {name!r}: device family {getattr(family, 'vendor', family)!r} ignored: {problem}")
                else:
                    found.append(family)
        return tuple(found)

    def register_impls(self, registry: Registry) -> None:
        """Every plugin's ``xbackend_register_impls`` into ``registry``: all of a plugin's impls, or
        none of them when one fails (the plugin's status says why)."""
        for hookimpl in self.pm.hook.xbackend_register_impls.get_hookimpls():
            name = hookimpl.plugin_name
            registrar = Registrar(registry, name)
            snapshot = registry.snapshot()
            try:
                hookimpl.function(*[{"registrar": registrar}[a] for a in hookimpl.argnames])
            except Exception as e:
                registry.restore(snapshot)
                status = self.status.setdefault(name, PluginStatus(name, "explicit"))
                status.error = f"registration failed: {type(e).__name__}: {e}"
                log.warning("xbackend: plugin %r failed to register and was skipped: %s", name, status.error)
                continue
            self.status.setdefault(name, PluginStatus(name, "explicit")).impls = [f"{i.op}:{i.name}" for i in registrar.added]

    def check_names(self, registry: Registry) -> None:
        """A problem for each name in ``XBACKEND_PLUGINS`` (or ``entry_points``) or the blocklist that
        matches nothing."""
        if self.only:
            unknown = sorted(self.only - set(self.status))
            if unknown:
                self.problem(f"{self.selected_by} names no installed plugin: {', '.join(unknown)} "
                             f"(installed: {', '.join(self.entry_point_names()) or 'none'})")
        known = set(self.status)
        for op in registry.ops():
            for impl in registry.impls(op):
                known |= {impl.name, impl.qualname}
        unknown = sorted(self.blocked - known)
        if unknown:
            self.problem(f"XBACKEND_BLOCK names no plugin or impl: {', '.join(unknown)}")


def _is_builtin(ep: importlib.metadata.EntryPoint) -> bool:
    dist = getattr(getattr(ep, "dist", None), "name", None) or ""
    return RESERVED_PLUGINS.get(ep.name) is not None and _reserved_refusal(ep.name, ep.value, dist) is None


def _reserved_refusal(name: str, value: str, dist: str) -> str | None:
    """Why an entry point may not use ``name``, or None."""
    if name not in RESERVED_PLUGINS:
        return None
    builtin = RESERVED_PLUGINS[name]
    if builtin is not None and value == builtin and dist.lower().replace("_", "-") == _DISTRIBUTION:
        return None
    owner = "the reference" if builtin is None else "the builtin backend"
    return f"refused: the plugin name {name!r} is reserved for {owner}; the package must use another entry-point name"
