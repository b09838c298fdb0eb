"""Per-context resolution policy: the quality tier and forced impls, set by ``quality()``/``use()``."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ._precision import QUALITY_TIERS

__all__ = ["Policy", "current_policy", "quality", "use"]

# (quality tier, ((op, impl name), ...)): a plain tuple, so the hot path hashes it cheaply.
Policy = tuple[str, tuple[tuple[str, str], ...]]
_DEFAULT: Policy = ("lossless", ())
_POLICY: contextvars.ContextVar[Policy] = contextvars.ContextVar("xbackend_policy", default=_DEFAULT)


def current_policy() -> Policy:
    return _POLICY.get()


@contextlib.contextmanager
def quality(tier: str) -> Iterator[None]:
    """Admit impls by precision contract: ``"lossless"`` (default) only bit-exact ones, ``"high"``
    up to 1 ULP, ``"fast"`` any declared contract."""
    if tier not in QUALITY_TIERS:
        raise ValueError(f"quality: expected one of {', '.join(map(repr, QUALITY_TIERS))}, got {tier!r}")
    forced = _POLICY.get()[1]
    token = _POLICY.set((tier, forced))
    try:
        yield
    finally:
        _POLICY.reset(token)


@contextlib.contextmanager
def use(**forced: str) -> Iterator[None]:
    """Force an impl per op, e.g. ``use(rmsnorm_modulate="triton")``; ``"reference"`` forces the
    reference. A forced impl that cannot take a call raises with the reason instead of falling back."""
    from .ops import OPS

    for op, name in forced.items():
        if op not in OPS:
            raise ValueError(f"use: unknown op {op!r}; expected one of {', '.join(OPS)}")
        if not isinstance(name, str):
            raise TypeError(f"use: impl name for {op!r} must be a str, got {type(name).__name__}")
    tier, current = _POLICY.get()
    merged = dict(current) | forced
    token = _POLICY.set((tier, tuple(sorted(merged.items()))))
    try:
        yield
    finally:
        _POLICY.reset(token)
