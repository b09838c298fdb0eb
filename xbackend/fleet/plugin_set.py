"""The plugin set a golden records, and planning a target with exactly that set.

A golden records the plugins its plans were made with (``plugins``: the names of the plugins loaded,
sorted). ``--check DIR`` and ``--update DIR`` plan each target with its golden's set: a plugin loaded
here but not in the set is left out of the run and named on stderr, so installing a third-party plugin
does not make every plan drift; a plugin in the set that is not loaded here is named too (what it
contributed then drifts). ``--all-plugins`` plans with every plugin loaded here instead, as does a target
without a golden; what a run planned with is what ``--update`` records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._plugins import Plugins
from .._runtime import Runtime
from . import golden
from .matrix import loaded_plugins

__all__ = ["PluginSets", "TargetSet"]


@dataclass(frozen=True)
class TargetSet:
    """How one target's plugin set was chosen: ``recorded`` is its golden's set (None: no golden
    records one, or ``--all-plugins``), ``planned`` what it is planned with."""

    target: str
    recorded: tuple[str, ...] | None
    planned: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # loaded here, not in the recorded set: not planned with
    not_loaded: tuple[tuple[str, str], ...] = ()  # in the recorded set, not loaded here: (name, why)
    every_plugin: bool = False  # --all-plugins: planned with every loaded plugin whatever was recorded


class PluginSets:
    """The plugin set of each target of one run, and a runtime per distinct set."""

    def __init__(self, rt: Any, directory: str | None, *, every_plugin: bool = False) -> None:
        self.rt = rt
        self.directory = directory
        self.every_plugin = every_plugin
        self.loaded = loaded_plugins(rt)
        self.targets: dict[str, TargetSet] = {}
        self._runtimes: dict[tuple[str, ...], Any] = {self.loaded: rt}

    def runtime_for(self, target: str) -> Any:
        """The runtime that plans ``target``: ``rt`` itself, or one loading only its golden's plugin set."""
        chosen = self._choose(target)
        self.targets[target] = chosen
        found = self._runtimes.get(chosen.planned)
        if found is None:
            found = self._runtimes[chosen.planned] = _runtime_with(self.rt, chosen.planned)
        return found

    def _choose(self, target: str) -> TargetSet:
        recorded = golden.recorded_plugins(self.directory, target) if self.directory else None
        if recorded is None:
            return TargetSet(target, None, self.loaded)
        left_out = tuple(n for n in self.loaded if n not in recorded)
        not_loaded = tuple((n, self._why_not_loaded(n)) for n in recorded if n not in self.loaded)
        if self.every_plugin:
            return TargetSet(target, recorded, self.loaded, left_out, not_loaded, every_plugin=True)
        return TargetSet(target, recorded, tuple(n for n in self.loaded if n in recorded), left_out, not_loaded)

    def _why_not_loaded(self, name: str) -> str:
        status = self.rt.plugins.get(name)
        if status is not None and status.error is not None:
            return status.error
        if name in Plugins.entry_point_names():
            return "installed, not loaded: autoload is off and XBACKEND_PLUGINS does not name it"
        return "not installed"

    def missing_for_update(self) -> list[str]:
        """``--update`` would drop these recorded plugins from the goldens (one line each)."""
        if self.every_plugin:
            return []
        missing = dict.fromkeys((n, why) for t in self.targets.values() for n, why in t.not_loaded)
        return [f"--update: the goldens' plugin set names {n}, not loaded here ({why}); load it, or record the "
                f"plugins loaded here with --update {self.directory} --all-plugins" for n, why in missing]

    def notes(self) -> list[str]:
        """What differs between the goldens' plugin sets and the plugins loaded here, one line each
        (prefixed with the targets it concerns where it does not concern them all)."""
        groups: dict[tuple[Any, ...], list[str]] = {}
        for t in self.targets.values():
            if t.left_out or t.not_loaded:
                groups.setdefault((t.recorded, t.left_out, t.not_loaded, t.every_plugin), []).append(t.target)
        lines = []
        for (recorded, left_out, not_loaded, every_plugin), targets in groups.items():
            where = "" if len(groups) == 1 and len(targets) == len(self.targets) else f"{' '.join(targets)}: "
            named = ", ".join(recorded)
            if left_out and every_plugin:
                lines.append(f"{where}planned with every installed plugin (--all-plugins); not in the goldens' "
                             f"plugin set ({named}): {', '.join(left_out)}")
            elif left_out:
                lines.append(f"{where}not in the goldens' plugin set ({named}), left out: {', '.join(left_out)}; "
                             f"--all-plugins plans with every installed plugin")
            lines += [f"{where}in the goldens' plugin set, not loaded here: {n} ({why})" for n, why in not_loaded]
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The ``check`` document's ``plugins``: plugins left out of the run and recorded ones not loaded."""
        left_out = sorted({n for t in self.targets.values() if not t.every_plugin for n in t.left_out})
        not_loaded = {n: why for t in self.targets.values() for n, why in t.not_loaded}
        return {"left_out": left_out, "not_loaded": [{"plugin": n, "why": why} for n, why in sorted(not_loaded.items())]}


def _runtime_with(rt: Any, names: Iterable[str]) -> Any:
    """A runtime loading exactly ``names`` of ``rt``'s plugins, each the way ``rt`` loaded it (entry
    point or explicit object), with the names of ``rt``'s blocklist that match one of them or their
    impls (a name that matches only a plugin left out blocks nothing there, and would read as a typo)."""
    names = tuple(names)
    entry_points = [n for n in names if rt.plugins[n].source.startswith("entry point")]
    explicit = [(n, rt.pm.get_plugin(n)) for n in names if n not in entry_points]
    matched = set(names)
    for n in names:
        for entry in rt.plugins[n].impls:  # "op:impl"
            impl = entry.partition(":")[2]
            matched |= {impl, f"{n}:{impl}"}
    return Runtime(explicit, entry_points=entry_points, block=rt.blocked & matched)
