"""Which impl runs, and why every other candidate did not: policy as data.

Each filter looks at one candidate and returns None or a short reason. Filters run in the order
below and the first reason a candidate hits is the one reported, so reasons are ranked from the most
fundamental (wrong device) to the most specific (this exact input failed its first-use check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._device import Device
from ._opspec import OpSpec
from ._precision import QUALITY_TIERS, admits
from ._registry import Impl

__all__ = ["FILTERS", "Context", "Decision", "decide"]


@dataclass
class Context:
    spec: OpSpec
    args: tuple[Any, ...]
    device: Device
    quality: str
    forced: str | None
    blocked: frozenset[str]
    disabled: dict[str, str] = field(default_factory=dict)  # impl qualname -> why (this key only)
    availability: Callable[[Impl], str | None] = lambda impl: None


@dataclass(frozen=True)
class Decision:
    impl: Impl
    reason: str | None  # None: eligible

    @property
    def eligible(self) -> bool:
        return self.reason is None


def _forced(impl: Impl, c: Context) -> str | None:
    if c.forced is None or c.forced in (impl.name, impl.qualname):
        return None
    return f"not the forced impl (use({c.spec.name}={c.forced!r}))"


def _blocked(impl: Impl, c: Context) -> str | None:
    hit = {impl.backend, impl.name, impl.qualname} & c.blocked
    return f"blocked by XBACKEND_BLOCK ({', '.join(sorted(hit))})" if hit else None


def _device(impl: Impl, c: Context) -> str | None:
    return None if impl.runs_on(c.device) else f"needs {impl.devices}; device is {c.device.arch}"


def _dtype(impl: Impl, c: Context) -> str | None:
    dtype = c.spec.dtype_of(c.args)
    if dtype in impl.dtypes:
        return None
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in impl.dtypes))
    return f"dtype {str(dtype).removeprefix('torch.')} not in {{{names}}}"


def _quality(impl: Impl, c: Context) -> str | None:
    if admits(c.quality, impl.precision, c.spec.tolerant):
        return None
    looser = next((t for t in QUALITY_TIERS if admits(t, impl.precision, c.spec.tolerant)), "fast")
    return f"{impl.precision} needs quality {looser!r}; current is {c.quality!r}"


def _available(impl: Impl, c: Context) -> str | None:
    reason = c.availability(impl)
    return None if reason is None else f"unavailable: {reason}"


def _supports(impl: Impl, c: Context) -> str | None:
    if impl.supports is None:
        return None
    try:
        return impl.resolved("supports")(*c.args)
    except Exception as e:  # a broken predicate must not take dispatch down
        return f"supports() raised {type(e).__name__}: {e}"


def _disabled(impl: Impl, c: Context) -> str | None:
    reason = c.disabled.get(impl.qualname)
    return None if reason is None else f"disabled for this input: {reason}"


FILTERS: tuple[tuple[str, Callable[[Impl, Context], str | None]], ...] = (
    ("forced", _forced),
    ("blocked", _blocked),
    ("device", _device),
    ("dtype", _dtype),
    ("quality", _quality),
    ("available", _available),
    ("supports", _supports),
    ("disabled", _disabled),
)


def decide(impls: list[Impl], c: Context) -> list[Decision]:
    """One decision per impl, in priority order."""
    decisions = []
    for impl in impls:
        reason = None
        for _, check in FILTERS:
            if (reason := check(impl, c)) is not None:
                break
        decisions.append(Decision(impl, reason))
    return decisions


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
