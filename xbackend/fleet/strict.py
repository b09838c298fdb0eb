"""``--strict`` / ``XBACKEND_STRICT=1``: what a CI run must not let pass quietly. Each problem is a
line that names the fix; ``xbackend fleet`` and ``xbackend plan`` exit 3 when there is any."""

from __future__ import annotations

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
