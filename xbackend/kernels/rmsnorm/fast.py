"""The fast RMSNorm (+ modulate) kernel: one ``tl.sum`` of squares per row, eager's roundings after it.

Not bit-exact (the tree sum is Triton's order, not aten's); it serves inputs the exact kernel rejects
(torch flavour with D % 4 != 0 or misaligned x, D > 16384) under an ulp or tolerance contract.
Measured on an H200 over 16.8M elements: max 1 ULP ("torch"), 2 ULP ("diffusers"); the modulate up to
64 ULP where ``+ shift`` cancels (``python3 lab/gpu/rmsnorm_exact.py``, which runs at commit 5ce8995;
measured at commit 6c35253, torch 2.11.0+cu130, Triton 3.6, 2026-11-30; no raw output is committed:
docs/exactness.md, "How the order is verified").
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from xbackend.kernels.rmsnorm.primitives import bcast_ptrs, modulate, normalize, rsqrt
from xbackend.kernels.rmsnorm.tiles import MAX_FAST_D


@triton.jit
def _rmsnorm_fast_kernel(
    x_ptr,
    w_ptr,
    sc_ptr,
    sh_ptr,
    out_ptr,
    M,
    stride_xm,
    sc_inner,
    sc_so,
    sc_si,
    sc_sc,
    sh_inner,
    sh_so,
    sh_si,
    sh_sc,
    eps,
    inv_d,
    D: tl.constexpr,
    FLAVOUR: tl.constexpr,
    HAS_W: tl.constexpr,
    MODULATE: tl.constexpr,
    R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    RSQRT: tl.constexpr,
    WIDE: tl.constexpr,  # scale or shift spans 2**31 elements or more: column offsets in 64 bits (spans.py)
):
    pid = tl.program_id(0).to(tl.int64)
    rows = (pid * R + tl.arange(0, R))[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    rmask = rows < M
    cmask = cols < D
    mask = rmask & cmask
    x = tl.load(x_ptr + rows * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=1) * inv_d
    rstd = rsqrt(ms + eps, RSQRT)[:, None]
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        w = x  # unused
    y = normalize(x, rstd, w, FLAVOUR, HAS_W, out_dtype)
    if MODULATE:
        mc = cols.to(tl.int64) if WIDE else cols  # rows are 64-bit; the column meets the column stride
        sc = tl.load(bcast_ptrs(sc_ptr, rows, mc, 0, sc_inner, sc_so, sc_si, sc_sc), mask=mask, other=0.0)
        sh = tl.load(bcast_ptrs(sh_ptr, rows, mc, 0, sh_inner, sh_so, sh_si, sh_sc), mask=mask, other=0.0)
        y = modulate(y, sc, sh, out_dtype)
    tl.store(out_ptr + rows * D + cols, y, mask=mask)


class FastConstexprs(NamedTuple):
    """The fast kernel's constexpr arguments, named and ordered as in its signature."""

    D: int
    FLAVOUR: int
    HAS_W: bool
    MODULATE: bool
    R: int
    BLOCK_D: int
    RSQRT: int
    WIDE: bool


__all__ = ["MAX_FAST_D", "FastConstexprs"]
