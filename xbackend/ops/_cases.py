"""Conformance cases: the inputs every impl of an op must handle as its reference does.

Each op file defines ``cases(dtype, device) -> list[Case]`` next to its reference; the conformance suite
(``xbackend.testing.conformance``) runs every impl a plugin registers through them. The helpers here
build the layouts that break kernels: empty and one-row inputs, rows padded in memory, transposed and
stride-0 views, offsets past 2**31 elements, views of few elements spanning past 2**31, NaN and Inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Case", "big_offset", "big_offset_bytes", "expanded", "padded_rows", "randn", "span_past_2_31",
           "strided_last", "transposed", "with_specials"]

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


def span_past_2_31(*ts: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, ...]:
    """``ts``' values (one shape, dtype and device) in views of one buffer that hold few elements but
    whose last element sits 2**31 or more elements past the data pointer: consecutive slices along
    ``dim`` lie about 2**31 / (size - 1) elements apart, so index x stride passes 2**31 - 1 while the
    stride itself stays a 32-bit integer. Each slice is contiguous, the views' slices side by side (a row of a fused
    projection, a column of a modulation table); every dim before ``dim`` has size 1. The buffer holds
    about 2**31 elements, as ``big_offset``'s does."""
    shape = ts[0].shape
    dim %= len(shape)
    n, inner = shape[dim], math.prod(shape[dim + 1 :])
    if n < 2 or any(s != 1 for s in shape[:dim]) or any(t.shape != shape for t in ts):
        raise ValueError(f"span_past_2_31: needs one shape with size >= 2 at dim {dim} and 1 before it, got {shape}")
    pitch = -(-inner // 16) * 16  # every slice starts 16 elements aligned (vector loads)
    stride = max(len(ts) * pitch, -(-(INT32_ELEMS + 1 - inner) // (n - 1)))
    stride = -(-stride // 16) * 16
    if stride >= INT32_ELEMS:
        raise ValueError(f"span_past_2_31: {shape} along dim {dim} needs a stride of 2**31 or more")
    strides = [stride * n] * dim + [stride] + [math.prod(shape[i + 1 :]) for i in range(dim + 1, len(shape))]
    buf = torch.empty((n - 1) * stride + len(ts) * pitch, dtype=ts[0].dtype, device=ts[0].device)
    views = tuple(buf.as_strided(shape, strides, j * pitch) for j in range(len(ts)))
    for v, t in zip(views, ts, strict=True):
        v.copy_(t)
    return views
