"""The exact LayerNorm (+ adaLN modulate, + residual add) kernel: aten's thread block, emulated.

A program takes R rows; aten's block is emulated with an axis per thread: row element
``(k * A + a) * B + b`` is thread a's k-th vector, lane b. K steps load [R, A, B] (every thread's k-th
vector) and fold it into each thread's Welford state (``primitives.welford_vector``), then the
states are merged in ``compute_stats``' order (``primitives.row_stats``), then K more steps reload
the vectors (from cache) and write the output: the row is never held in registers whole.

* ``RESIDUAL``: the row is first ``x + update`` or ``x + update * gate``, each step rounded to the
  promoted dtype (the gate's: x's own, or float32 under a half x) and the sum once to x's dtype, as
  eager rounds it; that sum is stored (the op's first output) and normalized. The output phase
  recomputes it from the reloaded operands (same bits) rather than reading back another thread's store.
* ``FP32_OUT`` (flavour "fp32", FP32LayerNorm): the norm's fp32 value is modulated in fp32 (three
  roundings) and rounded to x's dtype once; else (flavour "torch") the norm is rounded to x's dtype
  and each modulate step is too.
* ``INDEX``: scale, shift (and the gate) are [2, B, D] tables; row (b, l) reads table
  ``index[b, l] != 0``.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from xbackend.kernels.layernorm.primitives import (
    affine,
    operand_ptrs,
    row_stats,
    vectors_per_thread,
    welford_vector,
)
from xbackend.kernels.rmsnorm.primitives import modulate


@triton.jit
def _residual(x_ptr, u_ptr, g_ptr, rr, cols, mask, stride_xm, stride_um, g_inner, g_so, g_si, g_sc, g_ss, sel,
              GATE: tl.constexpr):  # fmt: skip
    """``x + update`` (or ``x + update * gate``) rounded like eager, in x's dtype: the stored residual."""
    x = tl.load(x_ptr + rr * stride_xm + cols, mask=mask, other=0.0)
    u = tl.load(u_ptr + rr * stride_um + cols, mask=mask, other=0.0)
    if GATE:
        g = tl.load(operand_ptrs(g_ptr, rr, cols, g_inner, g_so, g_si, g_sc, sel, g_ss), mask=mask, other=0.0)
        promoted: tl.constexpr = g_ptr.dtype.element_ty
        prod = (u.to(tl.float32) * g.to(tl.float32)).to(promoted)
        h = (x.to(tl.float32) + prod.to(tl.float32)).to(promoted).to(x_ptr.dtype.element_ty)
    else:
        h = (x.to(tl.float32) + u.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return h


@triton.jit
def _layernorm_exact_kernel(
    x_ptr,
    u_ptr,  # RESIDUAL: the update
    g_ptr,  # RESIDUAL and GATE: the gate
    w_ptr,
    b_ptr,
    sc_ptr,
    sh_ptr,
    idx_ptr,  # INDEX: [B, L] per-token table selector
    out_ptr,
    h_ptr,  # RESIDUAL: receives the rounded sum, contiguous [M, D]
    mean_ptr,  # STORE_STAT: per-row mean and rstd (diagnostics)
    rstd_ptr,
    M,
    stride_xm,
    stride_um,
    idx_inner,
    idx_so,
    idx_si,
    sc_inner,
    sc_so,
    sc_si,
    sc_sc,
    sc_ss,
    sh_inner,
    sh_so,
    sh_si,
    sh_sc,
    sh_ss,
    g_inner,
    g_so,
    g_si,
    g_sc,
    g_ss,
    eps,
    D: tl.constexpr,
    R: tl.constexpr,  # rows per program
    K: tl.constexpr,  # loop steps of the emulated threads: ceil(D / (A * B))
    A: tl.constexpr,  # emulated threads per row (aten's block)
    B: tl.constexpr,  # vector width (aten's vec_size)
    LANES: tl.constexpr,  # lanes of aten's shuffle tree
    FP32_OUT: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    MODULATE: tl.constexpr,
    INDEX: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATE: tl.constexpr,
    STORE_STAT: tl.constexpr,
    RSQRT: tl.constexpr,  # rmsnorm.numerics.RSQRT_*
    RECIP: tl.constexpr,  # layernorm.numerics.RCP_*
    WIDE: tl.constexpr,  # an operand spans 2**31 elements or more: column offsets in 64 bits (spans.py)
):
    pid = tl.program_id(0).to(tl.int64)
    r1 = pid * R + tl.arange(0, R)
    rr = r1[:, None, None]
    toff = tl.arange(0, A)[None, :, None] * B + tl.arange(0, B)[None, None, :]  # [1, A, B]: thread a's vector lanes
    sel = tl.zeros([R, 1, 1], tl.int32)
    if INDEX:
        ro = r1 // idx_inner
        ri = r1 - ro * idx_inner
        pick = tl.load(idx_ptr + ro * idx_so + ri * idx_si, mask=r1 < M, other=0)
        sel = (pick != 0).to(tl.int32)[:, None, None]

    # Statistics: each emulated thread folds its k-th vector into its Welford state, k = 0, 1, ..
    nvec = vectors_per_thread(D, A, B)
    mean = tl.zeros([R, A], tl.float32)
    m2 = tl.zeros([R, A], tl.float32)
    for k in tl.static_range(K):
        cols = toff + k * (A * B)
        mask = (rr < M) & (cols < D)
        mcols = cols
        if WIDE:
            mcols = cols.to(tl.int64)
        if RESIDUAL:
            h = _residual(x_ptr, u_ptr, g_ptr, rr, mcols, mask, stride_xm, stride_um, g_inner, g_so, g_si, g_sc, g_ss,
                          sel, GATE)  # fmt: skip
            tl.store(h_ptr + rr * D + cols, h, mask=mask)
            xk = h.to(tl.float32)
        else:
            xk = tl.load(x_ptr + rr * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        mean, m2 = welford_vector(xk, mean, m2, nvec, k, RECIP)
    mean, rstd = row_stats(mean, m2, nvec, eps, D, B, LANES, RSQRT, RECIP)
    if STORE_STAT:
        tl.store(mean_ptr + r1, mean, mask=r1 < M)
        tl.store(rstd_ptr + r1, rstd, mask=r1 < M)

    # Output, a vector per emulated thread at a time: x is reloaded (cached) rather than kept in registers.
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    mean = mean[:, None, None]
    rstd = rstd[:, None, None]
    for k in tl.static_range(K):
        cols = toff + k * (A * B)
        cmask = cols < D
        mask = (rr < M) & cmask
        mcols = cols
        if WIDE:
            mcols = cols.to(tl.int64)
        if RESIDUAL:
            xk = _residual(x_ptr, u_ptr, g_ptr, rr, mcols, mask, stride_xm, stride_um, g_inner, g_so, g_si, g_sc,
                           g_ss, sel, GATE).to(tl.float32)  # fmt: skip
        else:
            xk = tl.load(x_ptr + rr * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
        w = xk  # unread without HAS_W
        b = xk  # unread without HAS_B
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_B:
            b = tl.load(b_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = affine(xk, mean, rstd, w, b, HAS_W, HAS_B)
        if not FP32_OUT:
            y = y.to(out_dtype)  # F.layer_norm's output in x's dtype
        if MODULATE:
            sc = tl.load(operand_ptrs(sc_ptr, rr, mcols, sc_inner, sc_so, sc_si, sc_sc, sel, sc_ss), mask=mask,
                         other=0.0)  # fmt: skip
            sh = tl.load(operand_ptrs(sh_ptr, rr, mcols, sh_inner, sh_so, sh_si, sh_sc, sel, sh_ss), mask=mask,
                         other=0.0)  # fmt: skip
            if FP32_OUT:  # (y * (1 + scale) + shift) in fp32, three roundings (fp fusion is off)
                y = y * (sc.to(tl.float32) + 1.0) + sh.to(tl.float32)
            else:
                y = modulate(y, sc, sh, out_dtype)
        tl.store(out_ptr + rr * D + cols, y.to(out_dtype), mask=mask)


class ExactConstexprs(NamedTuple):
    """The kernel's constexpr arguments, named and ordered as in its signature."""

    D: int
    R: int
    K: int
    A: int
    B: int
    LANES: int
    FP32_OUT: bool
    HAS_W: bool
    HAS_B: bool
    MODULATE: bool
    INDEX: bool
    RESIDUAL: bool
    GATE: bool
    STORE_STAT: bool
    RSQRT: int
    RECIP: int
    WIDE: bool


__all__ = ["ExactConstexprs"]
