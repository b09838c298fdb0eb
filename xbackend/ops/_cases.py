"""Conformance cases: the inputs every impl of an op must handle as its reference does.

Each op file defines ``cases(dtype, device) -> list[Case]`` next to its reference; the conformance suite
(``xbackend.testing.conformance``) runs every impl a plugin registers through them. The helpers here
build the layouts that break kernels: empty and one-row inputs, rows padded in memory, transposed and
stride-0 views, offsets past 2**31 elements, NaN and Inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Case", "big_offset", "big_offset_bytes", "expanded", "padded_rows", "randn", "strided_last", "transposed", "with_specials"]

# A view past this many elements needs 64-bit offsets in a kernel (int32 indexing overflows).
INT32_ELEMS = 2**31


@dataclass(frozen=True)
class Case:
    """One call: ``args`` as the op's ``bind`` takes them (positionally)."""

    name: str
    args: tuple[Any, ...]


def randn(*shape: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def padded_rows(t: torch.Tensor, pad: int = 8) -> torch.Tensor:
    """``t`` as a view whose rows are ``pad`` elements apart in memory (a slice of a wider buffer)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + pad, dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def strided_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a view with last-dim stride 2."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def misaligned(t: torch.Tensor, by: int = 1) -> torch.Tensor:
    """``t``'s values in a contiguous view starting ``by`` elements past an aligned allocation."""
    flat = torch.zeros(t.numel() + by, dtype=t.dtype, device=t.device)
    out = flat[by:].view(t.shape)
    out.copy_(t)
    return out


def transposed(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the transpose of a contiguous tensor (last-dim stride = the row count)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def expanded(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` (size 1 at ``dim``) expanded to ``size`` there: stride 0."""
    shape = list(t.shape)
    shape[dim] = size
    return t.expand(*shape)


def with_specials(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with NaN, +Inf and -Inf in its first row."""
    out = t.clone()
    flat = out.view(-1, out.shape[-1])
    if flat.shape[0] and flat.shape[1] >= 3:
        flat[0, 0], flat[0, 1], flat[0, 2] = float("nan"), float("inf"), float("-inf")
    return out


def big_offset(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view that starts past element 2**31 of a larger buffer."""
    buf = torch.empty(INT32_ELEMS + t.numel() + 64, dtype=t.dtype, device=t.device)
    view = buf[INT32_ELEMS + 64 :].view(t.shape)
    view.copy_(t)
    return view


def big_offset_bytes(t: torch.Tensor) -> int:
    """Device memory ``big_offset(t)`` allocates."""
    return (INT32_ELEMS + t.numel() + 64) * t.element_size()
