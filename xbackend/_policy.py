"""Per-context policy: the quality tier, forced impls and the verification mode, set by
``quality()``, ``use()`` and ``verify()``."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ._guard import VerifyMode, env_verify_mode, parse_verify_mode
from ._precision import QUALITY_TIERS

__all__ = ["Policy", "current_policy", "quality", "use", "verify"]

# (quality tier, ((op, impl name), ...), verification mode): a plain tuple, so the hot path hashes it
# cheaply. Each policy has its own dispatch cache.
Policy = tuple[str, tuple[tuple[str, str], ...], VerifyMode]
_DEFAULT: Policy = ("lossless", (), env_verify_mode())
_POLICY: contextvars.ContextVar[Policy] = contextvars.ContextVar("xbackend_policy", default=_DEFAULT)

REFERENCE = "reference"


def current_policy() -> tuple[str, tuple[tuple[str, str], ...]]:
    """(quality tier, forced impls) in effect here."""
    tier, forced, _ = _POLICY.get()
    return tier, forced


def current_verify_mode() -> VerifyMode:
    return _POLICY.get()[2]


@contextlib.contextmanager
def _set(policy: Policy) -> Iterator[None]:
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


@contextlib.contextmanager
def quality(tier: str) -> Iterator[None]:
    """Admit impls by precision contract. On an op with an exact reference: ``"lossless"`` (default)
    bit-exact impls only, ``"high"`` up to 1 ULP, ``"fast"`` any declared contract. On a tolerant op
    (neighborhood_attention, whose fp32 reference no kernel matches bit for bit) every tier admits every
    contract, each checked against the fp32 reference. The table is ``_precision.ADMITTED``."""
    if tier not in QUALITY_TIERS:
        raise ValueError(f"quality: expected one of {', '.join(map(repr, QUALITY_TIERS))}, got {tier!r}")
    _, forced, mode = _POLICY.get()
    with _set((tier, forced, mode)):
        yield


@contextlib.contextmanager
def use(**forced: str) -> Iterator[None]:
    """Force an impl per op, e.g. ``use(rmsnorm_modulate="triton")``; ``"reference"`` forces the
    reference. A forced impl that cannot take a call raises with the reason instead of falling back."""
    from ._api import unknown_op
    from .ops import OPS

    for op, name in forced.items():
        if op not in OPS:
            raise unknown_op("use", op, list(OPS))
        if not isinstance(name, str):
            raise TypeError(f"use: impl name for {op!r} must be a str, got {type(name).__name__}")
    tier, current, mode = _POLICY.get()
    merged = dict(current) | forced
    with _set((tier, tuple(sorted(merged.items())), mode)):
        yield


@contextlib.contextmanager
def verify(mode: str) -> Iterator[None]:
    """When the guard compares impls with the reference in this block: ``"first"`` (the first call
    per runtime key; the default, or ``XBACKEND_VERIFY``), ``"sample:N"`` (also one later call in N,
    per key) or ``"always"`` (every call)."""
    parsed = parse_verify_mode(mode)
    tier, forced, _ = _POLICY.get()
    with _set((tier, forced, parsed)):
        yield
