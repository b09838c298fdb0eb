"""Which report entry each fused call of a patched model serves.

Patched code calls every fused op through `fused`, naming the site as the patch report lists it: its kind
and the module its path names. An observer installed with `observe` answers those calls instead
(``xbackend.attribute`` records each site's impl and error through one, and runs chosen sites on the
reference); with none installed, `fused` is the op call plus one global read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["Observer", "fused", "observe"]

# (op, site kind, the module the report's path names or None, the op's arguments) -> the op's output.
Observer = Callable[[Any, str, "nn.Module | None", tuple[Any, ...]], Any]
_observer: Observer | None = None


def fused(op: Any, kind: str, site: nn.Module | None, *args: Any) -> Any:
    """``op(*args)``, the fused call of the report's ``kind`` site at module ``site`` (None: a call that
    names no site, which ``xbackend.attribute`` cannot switch). Without an observer this costs one global
    read a call: within the noise of a 4 µs CPU op call, measured."""
    observer = _observer
    if observer is None:
        return op(*args)
    return observer(op, kind, site, args)


def observe(observer: Observer | None) -> Observer | None:
    """Install ``observer`` for every patched model in the process (None removes it); returns the one
    it replaces."""
    global _observer
    previous, _observer = _observer, observer
    return previous
