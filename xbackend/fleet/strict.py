"""``--strict`` / ``XBACKEND_STRICT=1``: what a CI run must not let pass quietly. Each problem is a
line that names the fix; ``xbackend fleet`` and ``xbackend plan`` exit 3 when there is any."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

__all__ = ["STRICT_EXIT", "fn_problems", "load_problems", "strict_requested"]

STRICT_EXIT = 3
CORE = "xbackend"


def strict_requested(flag: bool) -> bool:
    return flag or os.environ.get("XBACKEND_STRICT", "") not in ("", "0")


def _env_names(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def _unknown_names(rt: Any) -> list[str]:
    """Names in XBACKEND_PLUGINS / XBACKEND_BLOCK that match nothing (a typo silently does nothing)."""
    plugins = set(rt.plugins)
    impls = {n for op in rt.registry.ops() for i in rt.candidates(op) for n in (i.name, i.qualname)}
    problems = []
    if os.environ.get("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0"):
        for name in _env_names("XBACKEND_PLUGINS"):
            if name not in plugins:
                problems.append(f"XBACKEND_PLUGINS names {name!r}, which is no installed plugin "
                                f"(loaded: {', '.join(sorted(plugins)) or 'none'}); fix the name or install it")
    for name in sorted(getattr(rt, "blocked", ())):
        if name != CORE and name not in plugins and name not in impls:
            problems.append(f"XBACKEND_BLOCK names {name!r}, which is no plugin or impl; use a plugin name, "
                            "an impl name or plugin:impl")
    return problems


def load_problems(rt: Any) -> list[str]:
    """Plugins that failed to import or register, and unknown names in the plugin env vars. The
    runtime's own ``problems`` list is used where it has one."""
    problems = []
    for name in sorted(rt.plugins):
        error = rt.plugins[name].error
        if error is not None and not error.startswith("blocked"):
            problems.append(f"plugin {name!r} failed to load: {error} (fix or uninstall it, or block it "
                            f"with XBACKEND_BLOCK={name})")
    own = getattr(rt, "problems", None)
    problems += list(own) if own is not None else _unknown_names(rt)
    return problems


def fn_problems(rt: Any, ops: Iterable[str]) -> list[str]:
    """Impls whose ``fn`` does not import: they would pass every plan and fail on first use."""
    problems = []
    for op in ops:
        for impl in rt.candidates(op):
            if impl.backend == CORE:
                continue
            try:
                impl.resolved("fn")
            except Exception as e:
                problems.append(f"{op}: impl {impl.qualname} has fn {impl.fn!r}, which does not import: "
                                f"{type(e).__name__}: {e}")
    return problems
