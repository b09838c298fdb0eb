"""The process-wide runtime: the one slot every call into xbackend dispatches through.

The op layer (``_opspec.define_op``: each op's torch custom op and its inference twin) calls into the
runtime, and the runtime (``_runtime``) is built from the op layer's table (``ops.OPS``). This module
sits below both and imports neither: it holds the process-wide runtime and the constructor of the
default one, which ``_runtime`` installs as it loads (``xbackend/__init__`` imports ``_runtime``, so that
happens before any op can be called).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._opspec import OpSpec
    from ._precision import Output
    from ._runtime import Runtime

__all__ = ["current", "dispatch", "runtime", "set_default", "set_runtime"]

_current: Runtime | None = None
_lock = threading.Lock()
_default: Callable[[], Runtime] | None = None


def set_default(factory: Callable[[], Runtime]) -> None:
    """The constructor :func:`runtime` creates the process-wide runtime with (``_runtime.Runtime``)."""
    global _default
    _default = factory


def runtime() -> Runtime:
    """The process-wide runtime, created on first use."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                if _default is None:
                    raise RuntimeError("xbackend: no runtime constructor installed; import xbackend, whose "
                                       "_runtime module installs it")  # fmt: skip
                _current = _default()
    return _current


def set_runtime(rt: Runtime | None) -> Runtime | None:
    """Swap the process-wide runtime (tests); returns the previous one."""
    global _current
    previous, _current = _current, rt
    return previous


def current() -> Runtime | None:
    """The process-wide runtime if one exists (never creates it)."""
    return _current


def dispatch(spec: OpSpec, args: tuple[Any, ...]) -> Output:
    return (_current or runtime()).dispatch(spec, args)
