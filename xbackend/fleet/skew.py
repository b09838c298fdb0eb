"""Version skew: which chosen impls a lane (a torch / Triton pair the fleet runs) on a target's arch has
no hardware verification for. Each impl's ``verified_on`` lists the (torch, Triton) version prefixes,
and the arch, its precision contract was checked on with real hardware (a pair without an arch claims
every arch); elsewhere the guard still checks each first use against the reference and falls back
when the result differs."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._device import arch_key
from .._registry import Impl
from .spec import Lane

__all__ = ["Unverified", "host_lane", "matches", "unverified", "verified"]

# Distributions that provide the `triton` module, by torch build: upstream, ROCm wheels, nightlies.
_TRITON_DISTS = ("triton", "pytorch-triton-rocm", "pytorch-triton", "triton-rocm")


@dataclass(frozen=True)
class Unverified:
    lane: Lane
    impls: tuple[str, ...]  # "backend:impl", sorted
    arch: str = ""  # the target's arch ("" where none was asked about)

    @property
    def message(self) -> str:
        where = f" on {self.arch}" if self.arch else ""
        return (f"exactness unverified on torch {self.lane.torch} / Triton {self.lane.triton}{where}: "
                "the guard falls back if it differs")

    def to_dict(self) -> dict[str, Any]:
        return {"lane": self.lane.name, "torch": self.lane.torch, "triton": self.lane.triton, "arch": self.arch,
                "impls": list(self.impls), "message": self.message}


def matches(version: str, prefix: str) -> bool:
    """``"2.11.0+cu130"`` matches ``"2.11"`` and ``"2.11.0"``, never ``"2.1"`` (prefixes end at a
    component boundary)."""
    return version == prefix or version.startswith((prefix + ".", prefix + "+"))


def verified(impl: Impl, lane: Lane, arch: str = "") -> bool:
    """A run of ``impl.verified_on`` matches the lane's versions and ``arch`` (a run without an arch
    matches every arch; ``arch`` "" asks about versions only)."""
    return any(matches(lane.torch, run[0]) and matches(lane.triton, run[1])
               and (not arch or len(run) < 3 or _same_arch(run[2], arch)) for run in impl.verified_on)


def _same_arch(a: str, b: str) -> bool:
    # The devices grammar's order key: sm_90 and sm90 (and sm90a, the same hardware) are one arch.
    return arch_key(a) == arch_key(b)


def unverified(plans: Iterable[Any], lanes: Iterable[Lane], impls: Mapping[str, Impl],
               arch: str = "") -> tuple[Unverified, ...]:
    """Per lane, the impls chosen in ``plans`` that were never verified on that lane's versions on
    ``arch`` (the reference is the definition of right, so it is never listed)."""
    chosen = sorted({p.chosen.qualname for p in plans if p.chosen.backend != "xbackend"})
    out = []
    for lane in lanes:
        missing = tuple(q for q in chosen if q in impls and not verified(impls[q], lane, arch))
        if missing:
            out.append(Unverified(lane, missing, arch))
    return tuple(out)


def _triton_version() -> str:
    for dist in _TRITON_DISTS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def host_lane() -> Lane:
    """This process's torch and Triton, as the lane a real local device runs."""
    return Lane("host", torch.__version__, _triton_version())
