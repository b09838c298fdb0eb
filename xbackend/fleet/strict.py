"""``--strict`` / ``XBACKEND_STRICT=1``: what a CI run must not let pass quietly. Each problem is a
line that names the fix; ``xbackend fleet`` and ``xbackend plan`` exit 3 when there is any."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from .._plugins import env_flag

__all__ = ["STRICT_EXIT", "fn_problems", "load_problems", "strict_requested"]

STRICT_EXIT = 3
CORE = "xbackend"


def strict_requested(flag: bool) -> bool:
    return flag or env_flag("XBACKEND_STRICT")


def load_problems(rt: Any) -> list[str]:
    """Plugins that failed to import or register, unknown names in the plugin env vars and bad
    environment values: ``Runtime.load_problems`` (the same list as ``xbackend.problems()``)."""
    return rt.load_problems()


def fn_problems(rt: Any, ops: Iterable[str]) -> list[str]:
    """Impls whose ``fn`` does not import: they would pass every plan and fail on first use.

    An impl whose own ``available()`` says it cannot run on this host (Triton, NATTEN or aiter missing)
    may need that dependency to import its ``fn``; there the ``fn``'s module is only looked up, so a
    misspelt module is still a problem while a host without the dependency is not.
    """
    problems = []
    for op in ops:
        for impl in rt.candidates(op):
            if impl.backend == CORE:
                continue
            try:
                impl.resolved("fn")
                continue
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            if _unavailable_here(impl) is not None and _module_found(impl.fn):
                continue
            problems.append(f"{op}: impl {impl.qualname} has fn {impl.fn!r}, which does not import: {error}")
    return problems


def _unavailable_here(impl: Any) -> str | None:
    """Why the impl's own ``available()`` says it cannot run on this host, or None."""
    if impl.available is None:
        return None
    try:
        return impl.available()
    except Exception as e:  # an available() that raises says no as well (the runtime reads it so)
        return f"{type(e).__name__}: {e}"


def _module_found(fn: str) -> bool:
    """Whether the module of a ``"module:attr"`` string exists, found without executing it."""
    module = fn.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError as e:
        # A parent package failed on a dependency missing here (not on a package of the path itself).
        return e.name is not None and module != e.name and not module.startswith(f"{e.name}.")
    except Exception:  # a parent package that cannot import on this host: nothing to look up here
        return True
