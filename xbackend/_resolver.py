"""Which impl runs, and why every other candidate did not: policy as data.

Each filter looks at one candidate and returns None or a short reason. Filters run in the order
below and the first reason a candidate hits is the one reported, so reasons are ranked from the most
fundamental (wrong device) to the most specific (this exact input failed its first-use check).

Every decision also carries a machine-readable verdict: the code of the filter that rejected it
(``VERDICTS``), or for an eligible candidate ``chosen`` (the first eligible one, which the guard tries
first), ``tie`` (eligible at the chosen one's priority, sorted after it by backend then impl name) or
``lower_priority``. Candidates arrive ordered by priority, then backend name, then impl name
(``Registry.add``), so the same registry always gives the same verdicts.
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

__all__ = ["ELIGIBLE", "FILTERS", "VERDICTS", "Context", "Decision", "decide"]


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
    verdict: str = "chosen"  # a VERDICTS value or one of ELIGIBLE
    lost_to: Impl | None = None  # for "tie" and "lower_priority": the chosen impl

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


# Filter name -> the verdict code a rejection by it reports (stable: fleet goldens and CI read them).
VERDICTS: dict[str, str] = {
    "forced": "forced",
    "blocked": "blocked",
    "device": "arch",
    "dtype": "dtype",
    "quality": "quality",
    "available": "unavailable",
    "supports": "unsupported",
    "disabled": "disabled",
}
ELIGIBLE = ("chosen", "tie", "lower_priority")


def decide(impls: list[Impl], c: Context) -> list[Decision]:
    """One decision per impl, in the order given (priority, backend name, impl name)."""
    decisions = []
    chosen: Impl | None = None
    for impl in impls:
        reason = verdict = None
        for name, check in FILTERS:
            if (reason := check(impl, c)) is not None:
                verdict = VERDICTS[name]
                break
        if verdict is not None:
            decisions.append(Decision(impl, reason, verdict))
        elif chosen is None:
            chosen = impl
            decisions.append(Decision(impl, None, "chosen"))
        else:
            tied = impl.priority == chosen.priority
            decisions.append(Decision(impl, None, "tie" if tied else "lower_priority", chosen))
    return decisions


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
