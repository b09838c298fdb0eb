"""The exact RMSNorm (+ adaLN modulate) kernel and the tile it loads: aten's thread block, emulated.

``_rmsnorm_exact_kernel`` loads a tile of R rows whose axes are the emulated aten kernel's (thread,
vector lane, loop iteration), computes each row's statistic in that kernel's order (``row_stat``),
then normalizes (and modulates) with eager's roundings. With ``RESIDUAL`` the row is first the sum
``x + update``, rounded to x's dtype as eager's add rounds it and stored (the op's first output). The host side (``tiles``) derives the tile from a
``Numerics`` record and the row shape, as aten derives its launch:

* "torch" (``layer_norm_kernel.cu``): ``torch_threads`` threads, 4-element vectors, thread ``t`` reads
  vectors ``t, t + threads, ..``: tile [K, A = threads, B = 4].
* "diffusers" (``Reduce.cuh`` ``setReduceConfig`` for fp32 [M, D] reduced over D): block width ``bw``
  and height, rows split across ``Y`` warps for long rows; vectorized when D >= 128 (tile [K, A =
  threads, B = 4]), else ``MEAN_VEC`` strided accumulators per thread (tile [K, A = 4, B = threads]).

K is padded to a power of two; masked padding adds exact zeros at the end of every fold.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

try:  # Triton >= 3.4; without it the kernel is never launched with PDL (launch.pdl_capable)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton, or a build without the NVIDIA backend
    gdc_launch_dependents = gdc_wait = None

from xbackend.kernels.rmsnorm.primitives import (
    ARR_ARKB,
    FLAVOUR_TORCH,
    bcast_ptrs,
    modulate,
    normalize,
    row_stat,
    rsqrt,
)
from xbackend.kernels.rmsnorm.tiles import (
    MAX_EXACT_D,
    Tile,
    f32,
    last_pow2,
    mean_config,
    mean_factor,
    mean_tile,
    next_pow2,
    torch_tile,
)

COL_STRIDE = 1  # the exact kernel's col_stride argument (see the kernel)


# col_stride is always COL_STRIDE and unread: it stays a runtime parameter (do_not_specialize) so the
# kernel's parameter list, and with it the PTX, is the one verified bit-exact on the H200.
@triton.jit(do_not_specialize=["col_stride"])
def _rmsnorm_exact_kernel(
    x_ptr,
    w_ptr,
    sc_ptr,
    sh_ptr,
    out_ptr,
    stat_ptr,
    u_ptr,  # RESIDUAL: the update added to x
    h_ptr,  # RESIDUAL: receives x + update, contiguous [M, D]
    M,
    stride_xm,
    col_stride,
    stride_um,
    sc_inner,
    sc_so,
    sc_si,
    sc_sc,
    sh_inner,
    sh_so,
    sh_si,
    sh_sc,
    eps,
    factor,
    D: tl.constexpr,
    FLAVOUR: tl.constexpr,  # numerics.FLAVOUR_TORCH: aten fused rms_norm; FLAVOUR_DIFFUSERS: the mean reduce
    HAS_W: tl.constexpr,
    MODULATE: tl.constexpr,
    STORE_STAT: tl.constexpr,  # write rstd (torch) / mean of squares (diffusers) per row
    R: tl.constexpr,  # rows per program
    K: tl.constexpr,  # loop iterations per thread of the emulated kernel (padded to 2^n)
    A: tl.constexpr,  # VEC_FORM: emulated threads per row; else: vt0 accumulators
    B: tl.constexpr,  # VEC_FORM: vector width; else: emulated threads per row
    VEC_FORM: tl.constexpr,  # row element (k*A + a)*B + b
    ARR: tl.constexpr,  # tile arrangement, numerics.ARR_*
    LANES: tl.constexpr,
    BW: tl.constexpr,  # diffusers: block width (threads in x)
    Y: tl.constexpr,  # diffusers: threads in y sharing a row (warp split), 1 if none
    SHFL_ADJ: tl.constexpr,
    X_FIRST: tl.constexpr,
    RSQRT: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (launch.pdl_capable)
    MOD_FLAT: tl.constexpr,  # scale and shift are one [D] row for every row: loaded once, like the weight
    RESIDUAL: tl.constexpr,  # normalize x + update (and store it), not x
    WIDE: tl.constexpr,  # scale or shift spans 2**31 elements or more: column offsets in 64 bits (spans.py)
):
    if PDL:
        gdc_wait()  # the previous grid may have written x: wait for it before any load
        gdc_launch_dependents()  # the next PDL launch may start now; it waits the same way
    # The tile's dimension order steers Triton's load layout (lanes go to the most contiguous dim,
    # ties in dimension order), the arithmetic does not depend on it:
    #   ARR_ARKB [A, R, K, B]: 4-element vectors, thread = emulated thread (torch: folds in registers)
    #   ARR_MERGED [A*B, R, K]: 8-element (16-byte) vectors, two emulated threads per thread
    pid = tl.program_id(0).to(tl.int64)
    r1 = pid * R + tl.arange(0, R)
    if ARR == ARR_ARKB:
        rr = r1[None, :, None, None]
        kk = tl.arange(0, K)[None, None, :, None]
        toff = tl.arange(0, A)[:, None, None, None] * B + tl.arange(0, B)[None, None, None, :]
    else:
        rr = r1[None, :, None]
        kk = tl.arange(0, K)[None, None, :]
        toff = tl.arange(0, A * B)[:, None, None]
    koff = kk * (A * B)
    cols = toff + koff
    cmask = cols < D
    mask = (rr < M) & cmask
    x = tl.load(x_ptr + (rr * stride_xm + toff) + koff, mask=mask, other=0.0)
    if RESIDUAL:
        u = tl.load(u_ptr + (rr * stride_um + toff) + koff, mask=mask, other=0.0)
        # eager's add: one fp32 sum rounded to x's dtype; the norm reads that rounded sum
        x = (x.to(tl.float32) + u.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(h_ptr + (rr * D + toff) + koff, x, mask=mask)
    x = x.to(tl.float32)

    stat = row_stat(x, factor, D, FLAVOUR, R, K, A, B, VEC_FORM, ARR, LANES, BW, Y, SHFL_ADJ, X_FIRST)
    rstd = rsqrt(stat + eps, RSQRT)
    if STORE_STAT:
        if FLAVOUR == FLAVOUR_TORCH:
            tl.store(stat_ptr + r1, rstd, mask=r1 < M)
        else:
            tl.store(stat_ptr + r1, stat, mask=r1 < M)

    if ARR == ARR_ARKB:
        rstd = rstd[None, :, None, None]
    else:
        rstd = rstd[None, :, None]
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    if HAS_W:
        w = tl.load(w_ptr + toff + koff, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        w = x  # unused
    y = normalize(x, rstd, w, FLAVOUR, HAS_W, out_dtype)
    if MODULATE:
        # Rows are 64-bit already; scale and shift also multiply the column by their column stride.
        mt, mk = toff, koff
        if WIDE:
            mt, mk = toff.to(tl.int64), koff.to(tl.int64)
        if MOD_FLAT:  # the same values as the per-row load below, one copy per program (broadcast over R)
            sc = tl.load(sc_ptr + (mt + mk) * sc_sc, mask=cmask, other=0.0, eviction_policy="evict_last")
            sh = tl.load(sh_ptr + (mt + mk) * sh_sc, mask=cmask, other=0.0, eviction_policy="evict_last")
        else:
            sc = tl.load(bcast_ptrs(sc_ptr, rr, mt, mk, sc_inner, sc_so, sc_si, sc_sc), mask=mask, other=0.0)
            sh = tl.load(bcast_ptrs(sh_ptr, rr, mt, mk, sh_inner, sh_so, sh_si, sh_sc), mask=mask, other=0.0)
        y = modulate(y, sc, sh, out_dtype)
    tl.store(out_ptr + (rr * D + toff) + koff, y, mask=mask)


class ExactConstexprs(NamedTuple):
    """The exact kernel's constexpr arguments, named and ordered as in its signature."""

    D: int
    FLAVOUR: int
    HAS_W: bool
    MODULATE: bool
    STORE_STAT: bool
    R: int
    K: int
    A: int
    B: int
    VEC_FORM: bool
    ARR: int
    LANES: int
    BW: int
    Y: int
    SHFL_ADJ: bool
    X_FIRST: bool
    RSQRT: int
    PDL: bool
    MOD_FLAT: bool
    RESIDUAL: bool
    WIDE: bool


__all__ = [
    "COL_STRIDE",
    "MAX_EXACT_D",
    "ExactConstexprs",
    "Tile",
    "f32",
    "last_pow2",
    "mean_config",
    "mean_factor",
    "mean_tile",
    "next_pow2",
    "torch_tile",
]
