"""Triton RMSNorm and RMSNorm + adaLN modulate, bit-exact to eager PyTorch on CUDA.

Two reference flavours (see docs/exactness.md for the derivation from the aten sources):

* ``"torch"``: ``F.rms_norm`` -> aten ``_fused_rms_norm`` -> the vectorized LayerNorm kernel with
  ``rms_norm=true``. One block of ``torch_threads`` threads per row; thread ``t`` reads 4-element
  vectors ``t, t + threads, ...`` and folds ``acc = fma(x, x, acc)`` over them in order; a halving
  shuffle tree over the lanes of each warp, a halving tree over the warps; ``sum / float(D)`` (IEEE
  division), ``rsqrtf(. + eps)``; output ``round(w * (rstd * x))``.
* ``"diffusers"``: ``x.float().pow(2).mean(-1)`` -> aten's ``Reduce.cuh`` (``MeanOps``): per-thread
  accumulators (4 vector lanes, or ``vt0 = 4`` strided ones when D < 128), combined in order, then a
  block-x tree (shared memory above a warp, then shuffles), an optional block-y tree, then
  ``sum * factor``; ``x * rsqrtf(v + eps)`` in fp32, rounded to the weight dtype, times the weight.

Every floating-point step is spelled out (``tl.fma`` where nvcc contracts, ``tl.div_rn`` where CUDA
divides, ``rsqrt.approx.f32`` where CUDA calls ``rsqrtf``) and the kernels are compiled with
``enable_fp_fusion=False`` so LLVM cannot contract anything PyTorch rounds separately. Sequential
folds are written as recursive halving of the fold axis (``tl.split``), trees as sums over size-2
axes, so the result does not depend on the register layout Triton picks.

``rmsnorm_fast`` / ``rmsnorm_modulate_fast`` use one ``tl.sum`` of squares instead, for inputs the
exact kernels reject (torch flavour with D % 4 != 0 or misaligned x, D > 16384). Measured on an
H200 over 16.8M elements: rmsnorm max 1 ULP ("torch") / 2 ULP ("diffusers"); the modulate up to
64 ULP, where ``+ shift`` cancels (give it a tolerance contract).

Launch configuration (keyword arguments of every entry point): ``rows_per_program`` and
``num_warps``; the defaults were measured best on an H200 at [32640, 4096] bf16 (torch flavour: 2
rows per 8-warp program, ``_CUDA_TORCH_TUNED``; otherwise 1 row, 4 warps; 97-98% of ``copy_``). ``numerics`` picks the PyTorch build whose order is reproduced:
``CUDA_NUMERICS`` (verified) or ``ROCM_NUMERICS`` (read from the sources, not verified on AMD).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4; without it the kernels launch without PDL (_pdl_capable)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton, or a build without the NVIDIA backend
    gdc_launch_dependents = gdc_wait = None

from xbackend.kernels import _triton_launch
from xbackend.kernels._triton_launch import direct_capable, hooked, launch_compiled

FLAVOURS = ("torch", "diffusers")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_TORCH_VEC = 4  # aten layer_norm_kernel.cu: vec_size, the same for every dtype
_MEAN_VEC = 4  # Reduce.cuh: input_vec_size == vt0 == 4 for fp32 input (the squares are fp32)
_MEAN_VT0 = 4
_MAX_EXACT_D = 16384  # longest fold the kernel unrolls: 128 steps (torch) / 64 steps (mean)
_MAX_FAST_D = 32768

# ARR constexpr: how the exact kernel's tile is arranged (performance only, never the arithmetic).
ARR_ARKB = tl.constexpr(0)
ARR_BARK = tl.constexpr(1)
ARR_MERGED = tl.constexpr(2)

# RSQRT constexpr: which reciprocal square root the kernel calls.
RSQRT_PTX = 0  # rsqrt.approx.f32, what nvcc emits for rsqrtf (aten's rsqrt on CUDA)
RSQRT_MATH = 1  # tl.math.rsqrt: the interpreter, and the ROCm build (ocml rsqrt)


class Numerics(NamedTuple):
    """Which PyTorch build's reduction order to reproduce (constants of that build, not tunables)."""

    torch_threads: int  # threads per row of the vectorized layer-norm kernel: num_threads()
    warp: int  # C10_WARP_SIZE
    mean_shfl_increasing: bool  # Reduce.cuh block_x_reduce shuffles offsets 1,2,4.. (ROCm) or ..4,2,1 (CUDA)
    mean_x_first: bool  # Reduce.cuh reduces block x before block y (newer builds) or after
    rsqrt: int  # RSQRT_PTX or RSQRT_MATH


# torch 2.11 + CUDA: num_threads() = 4 warps, decreasing shuffle offsets, block_x before block_y.
CUDA_NUMERICS = Numerics(torch_threads=128, warp=32, mean_shfl_increasing=False, mean_x_first=True, rsqrt=RSQRT_PTX)
# ROCm builds: num_threads() = 1024, wave64, increasing shuffle offsets (#if USE_ROCM). Not verified on a GPU.
ROCM_NUMERICS = Numerics(torch_threads=1024, warp=64, mean_shfl_increasing=True, mean_x_first=True, rsqrt=RSQRT_MATH)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_numerics(x: torch.Tensor | None = None) -> Numerics:
    """The numerics of the PyTorch build this process runs (the reference is computed by it)."""
    base = ROCM_NUMERICS if torch.version.hip else CUDA_NUMERICS
    if _interpreting():
        return base._replace(rsqrt=RSQRT_MATH)  # inline PTX cannot run in the interpreter
    return base


# --------------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------------


@triton.jit
def _fold_step(acc, v, FMA: tl.constexpr):
    if FMA:
        return tl.fma(v, v, acc)  # nvcc contracts `sigma2 + val * val`
    else:
        return acc + v


@triton.jit
def _halves(x):
    """[R, P, 2H] -> first half [R, P, H], second half [R, P, H] (along the last axis)."""
    y = tl.reshape(x, [x.shape[0], x.shape[1], 2, x.shape[2] // 2])
    return tl.split(tl.permute(y, (0, 1, 3, 2)))


@triton.jit
def _fold1(x, acc, FMA: tl.constexpr):
    return _fold_step(acc, tl.reshape(x, [x.shape[0], x.shape[1]]), FMA)


@triton.jit
def _fold2(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold1(hi, _fold1(lo, acc, FMA), FMA)


@triton.jit
def _fold4(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold2(hi, _fold2(lo, acc, FMA), FMA)


@triton.jit
def _fold8(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold4(hi, _fold4(lo, acc, FMA), FMA)


@triton.jit
def _fold16(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold8(hi, _fold8(lo, acc, FMA), FMA)


@triton.jit
def _fold32(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold16(hi, _fold16(lo, acc, FMA), FMA)


@triton.jit
def _fold64(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold32(hi, _fold32(lo, acc, FMA), FMA)


@triton.jit
def _fold128(x, acc, FMA: tl.constexpr):
    lo, hi = _halves(x)
    return _fold64(hi, _fold64(lo, acc, FMA), FMA)


@triton.jit
def _fold(x, acc, FMA: tl.constexpr):
    """Left fold of x [R, P, N] over its last axis in index order into acc [R, P]."""
    N: tl.constexpr = x.shape[2]
    if N == 1:
        out = _fold1(x, acc, FMA)
    elif N == 2:
        out = _fold2(x, acc, FMA)
    elif N == 4:
        out = _fold4(x, acc, FMA)
    elif N == 8:
        out = _fold8(x, acc, FMA)
    elif N == 16:
        out = _fold16(x, acc, FMA)
    elif N == 32:
        out = _fold32(x, acc, FMA)
    elif N == 64:
        out = _fold64(x, acc, FMA)
    else:
        tl.static_assert(N == 128, "fold length must be a power of two <= 128")
        out = _fold128(x, acc, FMA)
    return out


@triton.jit
def _tree(v, N: tl.constexpr, ADJACENT: tl.constexpr):
    """Reduce v [R, G, N] over its last axis like a shuffle tree over N lanes -> [R, G].

    ADJACENT=False: offsets N/2, N/4, .., 1 (lane l adds lane l + offset: a halving tree).
    ADJACENT=True: offsets 1, 2, .., N/2 (lane 0 ends with ((v0+v1)+(v2+v3))+...).
    """
    tl.static_assert(N <= 1024, "tree wider than 1024 lanes")
    for _ in tl.static_range(10):  # log2(1024) levels at most; exhausted levels emit nothing
        if v.shape[2] > 1:
            if ADJACENT:
                v = tl.sum(tl.reshape(v, [v.shape[0], v.shape[1], v.shape[2] // 2, 2]), axis=3)
            else:
                v = tl.sum(tl.reshape(v, [v.shape[0], v.shape[1], 2, v.shape[2] // 2]), axis=2)
    return tl.reshape(v, [v.shape[0], v.shape[1]])


@triton.jit
def _block_x_tree(v, BW: tl.constexpr, LANES: tl.constexpr, ADJACENT: tl.constexpr):
    """Reduce.cuh block_x_reduce over v [R, G, BW] -> [R, G]."""
    R: tl.constexpr = v.shape[0]
    G: tl.constexpr = v.shape[1]
    if BW > LANES:
        # shared-memory halving (offsets BW/2 .. LANES) over the bits above the lane index
        h = tl.permute(tl.reshape(v, [R, G, BW // LANES, LANES]), (0, 1, 3, 2))
        h = _tree(tl.reshape(h, [R, G * LANES, BW // LANES]), BW // LANES, False)
        out = _tree(tl.reshape(h, [R, G, LANES]), LANES, ADJACENT)
    else:
        out = _tree(v, BW, ADJACENT)
    return out


@triton.jit
def _rsqrt(v, MODE: tl.constexpr):
    if MODE == 0:
        out = tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1)
    else:
        out = tl.math.rsqrt(v)
    return out


@triton.jit
def _normalize(x, rstd, w, FLAVOUR: tl.constexpr, HAS_W: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Output of rmsnorm from fp32 x, the row's rstd (broadcastable) and fp32 weight."""
    if FLAVOUR == 0:
        if HAS_W:
            y = (w * (rstd * x)).to(OUT_DTYPE)  # aten: gamma * (rstd * x), one rounding
        else:
            y = (rstd * x).to(OUT_DTYPE)
    else:
        h = (x * rstd).to(OUT_DTYPE)  # diffusers: round to the weight dtype first
        if HAS_W:
            y = (h.to(tl.float32) * w).to(OUT_DTYPE)
        else:
            y = h
    return y


@triton.jit
def _modulate(y, sc, sh, OUT_DTYPE: tl.constexpr):
    """Eager ``y * (1 + scale) + shift``: each op in fp32, rounded to the dtype."""
    one_plus = (sc.to(tl.float32) + 1.0).to(OUT_DTYPE)
    prod = (y.to(tl.float32) * one_plus.to(tl.float32)).to(OUT_DTYPE)
    return (prod.to(tl.float32) + sh.to(tl.float32)).to(OUT_DTYPE)


@triton.jit
def _bcast_ptrs(ptr, rows, toff, koff, inner, s_outer, s_inner, s_col):
    """Pointers into a [M, D]-broadcast operand: row r -> (r // inner, r % inner), column toff + koff."""
    ro = rows // inner
    ri = rows - ro * inner
    return ptr + (ro * s_outer + ri * s_inner + toff * s_col) + koff * s_col


# --------------------------------------------------------------------------------------------------
# Exact kernel
# --------------------------------------------------------------------------------------------------


@triton.jit
def _to_fold_order(x, ARR: tl.constexpr, R: tl.constexpr, K: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """The loaded tile as [R, A, B, K] whatever its arrangement (a pure relabeling)."""
    if ARR == ARR_ARKB:
        out = tl.permute(x, (1, 0, 3, 2))
    elif ARR == ARR_BARK:
        out = tl.permute(x, (2, 1, 0, 3))
    else:
        out = tl.permute(tl.reshape(x, [A, B, R, K]), (2, 0, 1, 3))
    return out


@triton.jit
def _row_stat(
    x,
    factor,
    D: tl.constexpr,
    FLAVOUR: tl.constexpr,
    R: tl.constexpr,
    K: tl.constexpr,
    A: tl.constexpr,
    B: tl.constexpr,
    VEC_FORM: tl.constexpr,
    ARR: tl.constexpr,
    LANES: tl.constexpr,
    BW: tl.constexpr,
    Y: tl.constexpr,
    SHFL_ADJ: tl.constexpr,
    X_FIRST: tl.constexpr,
):
    """Per-row statistic [R] of the fp32 tile x (arranged per ARR) in the flavour's exact order:
    sum of squares / D ("torch"), mean of squares ("diffusers"); rstd is rsqrt(stat + eps)."""
    if FLAVOUR == 0:
        # thread a folds its vectors k = 0.. and their 4 elements, k-major: fma(x, x, acc)
        xs = tl.permute(_to_fold_order(x, ARR, R, K, A, B), (0, 1, 3, 2))  # [R, A, K, B]
        acc = _fold(tl.reshape(xs, [R, A, K * B]), tl.zeros([R, A], tl.float32), True)
        acc = _tree(tl.reshape(acc, [R, A // LANES, LANES]), LANES, False)  # lanes, per warp
        tot = tl.reshape(_tree(tl.reshape(acc, [R, 1, A // LANES]), A // LANES, False), [R])  # warps
        stat = tl.div_rn(tot, tl.full([R], D, tl.float32))
    else:
        q = x * x  # pow(2) is its own rounded kernel; fp fusion is off, so no FMA with the add below
        qs = _to_fold_order(q, ARR, R, K, A, B)  # [R, A, B, K]
        if not VEC_FORM:
            qs = tl.permute(qs, (0, 2, 1, 3))  # [R, thread, accumulator, k]
        S: tl.constexpr = BW * Y
        acc = _fold(tl.reshape(qs, [R, S * 4, K]), tl.zeros([R, S * 4], tl.float32), False)
        acc = _fold(tl.reshape(acc, [R, S, 4]), tl.zeros([R, S], tl.float32), False)  # v0+v1+v2+v3
        acc = tl.reshape(acc, [R, Y, BW])
        if X_FIRST:
            acc = _block_x_tree(acc, BW, LANES, SHFL_ADJ)
            tot = tl.reshape(_tree(tl.reshape(acc, [R, 1, Y]), Y, False), [R])
        else:
            acc = _tree(tl.permute(acc, (0, 2, 1)), Y, False)
            tot = tl.reshape(_block_x_tree(tl.reshape(acc, [R, 1, BW]), BW, LANES, SHFL_ADJ), [R])
        stat = tot * factor
    return stat


@triton.jit(do_not_specialize=["col_stride"])
def _rmsnorm_exact_kernel(
    x_ptr,
    w_ptr,
    sc_ptr,
    sh_ptr,
    out_ptr,
    stat_ptr,
    M,
    stride_xm,
    col_stride,
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
    FLAVOUR: tl.constexpr,  # 0: aten fused rms_norm, 1: diffusers (mean reduce)
    HAS_W: tl.constexpr,
    MODULATE: tl.constexpr,
    STORE_STAT: tl.constexpr,  # write rstd (torch) / mean of squares (diffusers) per row
    R: tl.constexpr,  # rows per program
    K: tl.constexpr,  # loop iterations per thread of the emulated kernel (padded to 2^n)
    A: tl.constexpr,  # VEC_FORM: emulated threads per row; else: vt0 accumulators
    B: tl.constexpr,  # VEC_FORM: vector width; else: emulated threads per row
    VEC_FORM: tl.constexpr,  # row element (k*A + a)*B + b
    ARR: tl.constexpr,  # tile arrangement, see ARR_*
    STREAM: tl.constexpr,  # cache hints on the streamed x / out: 0 none, 1 evict-first, 2 x via L2 only (.cg), 3 both .cg
    LANES: tl.constexpr,
    BW: tl.constexpr,  # diffusers: block width (threads in x)
    Y: tl.constexpr,  # diffusers: threads in y sharing a row (warp split), 1 if none
    SHFL_ADJ: tl.constexpr,
    X_FIRST: tl.constexpr,
    RSQRT: tl.constexpr,
    PDL: tl.constexpr,  # launched with programmatic dependent launch (sm90+), see _use_pdl
):
    if PDL:
        gdc_wait()  # the previous grid may have written x: wait for it before any load
        gdc_launch_dependents()  # the next PDL launch may start now; it waits the same way
    # The tile's dimension order steers Triton's load layout (lanes go to the most contiguous dim,
    # ties in dimension order), the arithmetic does not depend on it:
    #   ARR_ARKB [A, R, K, B]: 4-element vectors, thread = emulated thread (torch: folds in registers)
    #   ARR_BARK [B, A, R, K]: scalar loads behind an opaque column stride, thread = one whole fold
    #   ARR_MERGED [A*B, R, K]: 8-element (16-byte) vectors, two emulated threads per thread
    pid = tl.program_id(0).to(tl.int64)
    r1 = pid * R + tl.arange(0, R)
    if ARR == ARR_ARKB:
        rr = r1[None, :, None, None]
        kk = tl.arange(0, K)[None, None, :, None]
        toff = tl.arange(0, A)[:, None, None, None] * B + tl.arange(0, B)[None, None, None, :]
    elif ARR == ARR_BARK:
        rr = r1[None, None, :, None]
        kk = tl.arange(0, K)[None, None, None, :]
        # the opaque stride (== 1) hides the contiguity from the coalescing pass; adding the
        # per-register k offset last lets every element address be base + immediate
        toff = tl.arange(0, A)[None, :, None, None] * B + tl.arange(0, B)[:, None, None, None] * col_stride
    else:
        rr = r1[None, :, None]
        kk = tl.arange(0, K)[None, None, :]
        toff = tl.arange(0, A * B)[:, None, None]
    koff = kk * (A * B)
    cols = toff + koff
    cmask = cols < D
    mask = (rr < M) & cmask
    if STREAM == 1:
        x = tl.load(x_ptr + (rr * stride_xm + toff) + koff, mask=mask, other=0.0, eviction_policy="evict_first")
    elif STREAM >= 2:
        x = tl.load(x_ptr + (rr * stride_xm + toff) + koff, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        x = tl.load(x_ptr + (rr * stride_xm + toff) + koff, mask=mask, other=0.0)
    x = x.to(tl.float32)

    stat = _row_stat(x, factor, D, FLAVOUR, R, K, A, B, VEC_FORM, ARR, LANES, BW, Y, SHFL_ADJ, X_FIRST)
    rstd = _rsqrt(stat + eps, RSQRT)
    if STORE_STAT:
        if FLAVOUR == 0:
            tl.store(stat_ptr + r1, rstd, mask=r1 < M)
        else:
            tl.store(stat_ptr + r1, stat, mask=r1 < M)

    if ARR == ARR_ARKB:
        rstd = rstd[None, :, None, None]
    elif ARR == ARR_BARK:
        rstd = rstd[None, None, :, None]
    else:
        rstd = rstd[None, :, None]
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    if HAS_W:
        w = tl.load(w_ptr + toff + koff, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        w = x  # unused
    y = _normalize(x, rstd, w, FLAVOUR, HAS_W, out_dtype)
    if MODULATE:
        sc = tl.load(_bcast_ptrs(sc_ptr, rr, toff, koff, sc_inner, sc_so, sc_si, sc_sc), mask=mask, other=0.0)
        sh = tl.load(_bcast_ptrs(sh_ptr, rr, toff, koff, sh_inner, sh_so, sh_si, sh_sc), mask=mask, other=0.0)
        y = _modulate(y, sc, sh, out_dtype)
    if STREAM == 1:
        tl.store(out_ptr + (rr * D + toff) + koff, y, mask=mask, eviction_policy="evict_first")
    elif STREAM == 3:
        tl.store(out_ptr + (rr * D + toff) + koff, y, mask=mask, cache_modifier=".cg")
    else:
        tl.store(out_ptr + (rr * D + toff) + koff, y, mask=mask)


# --------------------------------------------------------------------------------------------------
# Fast (single tl.sum) kernel
# --------------------------------------------------------------------------------------------------


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
):
    pid = tl.program_id(0).to(tl.int64)
    rows = (pid * R + tl.arange(0, R))[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    rmask = rows < M
    cmask = cols < D
    mask = rmask & cmask
    x = tl.load(x_ptr + rows * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=1) * inv_d
    rstd = _rsqrt(ms + eps, RSQRT)[:, None]
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        w = x  # unused
    y = _normalize(x, rstd, w, FLAVOUR, HAS_W, out_dtype)
    if MODULATE:
        sc = tl.load(_bcast_ptrs(sc_ptr, rows, cols, 0, sc_inner, sc_so, sc_si, sc_sc), mask=mask, other=0.0)
        sh = tl.load(_bcast_ptrs(sh_ptr, rows, cols, 0, sh_inner, sh_so, sh_si, sh_sc), mask=mask, other=0.0)
        y = _modulate(y, sc, sh, out_dtype)
    tl.store(out_ptr + rows * D + cols, y, mask=mask)


# False under the interpreter; tests and lab/gpu/host_overhead.py flip it to time Triton's own path.
_DIRECT = direct_capable(_rmsnorm_exact_kernel)


# --------------------------------------------------------------------------------------------------
# Host side: reduction plans
# --------------------------------------------------------------------------------------------------


def _last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class _Plan(NamedTuple):
    """Tile of the exact kernel: [K, A, B] per row, plus the emulated block shape."""

    k: int
    a: int
    b: int
    vec_form: bool
    bw: int
    y: int


@functools.lru_cache(maxsize=1024)  # pure in its ints; runs on every launch
def _torch_plan(d: int, num: Numerics) -> _Plan:
    """aten vectorized layer-norm kernel: torch_threads threads, vec_size 4, no tail (D % 4 == 0)."""
    threads = num.torch_threads
    iters = -(-(d // _TORCH_VEC) // threads)
    return _Plan(k=_next_pow2(iters), a=threads, b=_TORCH_VEC, vec_form=True, bw=threads, y=1)


def _mean_config(m: int, d: int, warp: int) -> tuple[bool, int, int, int] | str:
    """Reduce.cuh setReduceConfig for a contiguous fp32 [m, d] tensor reduced over its last dim.

    Returns (vectorize_input, block_width, threads in y per row, ctas per output) or a reason.
    """
    max_threads = 512  # mnt_wrapper<float>::MAX_NUM_THREADS
    vectorize = d >= 128  # reduction on the fastest dim, one reduce dim
    dim0 = d // _MEAN_VEC if vectorize else d
    dim1 = m
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    bw = min(dim0_pow2, warp)
    bh = min(dim1_pow2, max_threads // bw)
    bw = min(dim0_pow2, max_threads // bh)
    step_input = bw
    values_per_thread = -(-d // step_input)
    split_across_warps = values_per_thread >= min(bh * 16, 256)
    y = bh if split_across_warps else 1
    step_input *= y
    if split_across_warps and -(-d // step_input) >= 256:
        return "the mean reduce would split rows across thread blocks (global reduce)"
    return vectorize, bw, y, 1


@functools.lru_cache(maxsize=1024)  # pure in its ints; runs on every launch
def _mean_plan(m: int, d: int, num: Numerics) -> _Plan | str:
    cfg = _mean_config(m, d, num.warp)
    if isinstance(cfg, str):
        return cfg
    vectorize, bw, y, _ = cfg
    if vectorize and d % _MEAN_VEC:
        return "diffusers exact needs D % 4 == 0 when D >= 128 (aten shifts misaligned rows)"
    threads = bw * y
    if vectorize:
        iters = -(-(d // _MEAN_VEC) // threads)
        return _Plan(k=_next_pow2(iters), a=threads, b=_MEAN_VEC, vec_form=True, bw=bw, y=y)
    per_thread = -(-d // threads)
    iters = -(-per_thread // _MEAN_VT0)
    return _Plan(k=_next_pow2(iters), a=_MEAN_VT0, b=threads, vec_form=False, bw=bw, y=y)


def _mean_factor(m: int, d: int) -> float:
    """MeanOps factor: float(num_outputs) / numel, all in fp32 like aten."""
    return float(np.float32(m) / np.float32(m * d))


def _f32(v: float) -> float:
    return float(np.float32(v))


# --------------------------------------------------------------------------------------------------
# Host side: operands
# --------------------------------------------------------------------------------------------------


def _rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as [M, D] rows with unit column stride (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def _bcast_layout(
    t: torch.Tensor, shape: torch.Size, copy: bool = True
) -> tuple[torch.Tensor, int, int, int, int] | None:
    """(tensor, inner, outer stride, inner stride, column stride) addressing t broadcast to shape.

    Row r of the [M, D] view maps to (r // inner) * s_outer + (r % inner) * s_inner; every listed
    broadcast form ([D], [1,..,1,D], [B,1,D], [B,L,D], [B,1,1,1,D]) needs at most two such groups.
    Other layouts: a contiguous copy of t broadcast to shape, or None when ``copy`` is False.
    """
    te = t.expand(shape)
    lead = list(zip(shape[:-1], te.stride()[:-1], strict=True))
    groups: list[list[int]] = []  # [size, stride], innermost first
    for size, stride in reversed(lead):
        if size == 1:
            continue
        if groups and stride == groups[-1][1] * groups[-1][0]:
            groups[-1][0] *= size
        else:
            groups.append([size, stride])
    m = math.prod(shape[:-1])
    if len(groups) > 2:
        if not copy:
            return None
        tc = te.contiguous()
        return tc, max(m, 1), 0, shape[-1], 1
    if not groups:
        return te, max(m, 1), 0, 0, te.stride(-1)
    inner, s_inner = groups[0]
    s_outer = groups[1][1] if len(groups) == 2 else 0
    return te, inner, s_outer, s_inner, te.stride(-1)


def _check_common(x: torch.Tensor, weight: torch.Tensor | None, flavour: str) -> str | None:
    if flavour not in FLAVOURS:
        return f"unknown flavour {flavour!r}"
    if x.dtype not in _DTYPES:
        return f"dtype {x.dtype} not in bf16/fp16/fp32"
    # CUDA/ROCm, the interpreter on CPU, or meta tensors when the resolver plans for another device.
    if not (x.is_cuda or x.is_meta or (_interpreting() and x.device.type == "cpu")):
        return "needs a CUDA/ROCm tensor"
    if x.dim() == 0:
        return "needs at least one dimension"
    if weight is not None:
        if weight.dtype != x.dtype:
            return "weight dtype differs from x"
        if tuple(weight.shape) != (x.shape[-1],):
            return "weight is not [D]"
        if weight.device != x.device:
            return "weight on another device"
        if x.shape[-1] > 1 and weight.stride(0) != 1:
            return "weight is not contiguous (the kernels read it with unit stride)"
    return None


def _check_bcast(x: torch.Tensor, t: torch.Tensor, name: str) -> str | None:
    if t.dtype != x.dtype:
        return f"{name} dtype differs from x"
    if t.device != x.device:
        return f"{name} on another device"
    try:
        torch.broadcast_shapes(t.shape, x.shape)
    except RuntimeError:
        return f"{name} does not broadcast to x"
    if torch.broadcast_shapes(t.shape, x.shape) != x.shape:
        return f"{name} broadcasting would grow x"
    return None


def _aten_vectorizes(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """aten takes the vectorized kernel only if X (after expect_contiguous) and gamma are aligned."""
    align = _TORCH_VEC * x.element_size()
    if x.is_contiguous() and x.data_ptr() % align:
        return False
    return weight is None or not weight.is_contiguous() or weight.data_ptr() % align == 0


class NotVectorizable(ValueError):
    """x or the weight is not 4-element aligned, so aten runs its Welford kernel for this call and the
    torch-flavour exact kernel (its vectorized order) does not apply. Raised per call: alignment is a
    property of the pointer, not of the shapes a launch plan (or a dispatch key) is cached by."""


def _exact_reason(
    x: torch.Tensor, weight: torch.Tensor | None, flavour: str, num: Numerics, alignment: bool = True
) -> str | None:
    reason = _check_common(x, weight, flavour)
    if reason:
        return reason
    d = x.shape[-1]
    if d > _MAX_EXACT_D:
        return f"D > {_MAX_EXACT_D}"
    if flavour == "torch":
        if d % _TORCH_VEC:
            return "torch exact needs D % 4 == 0 (aten runs its Welford kernel otherwise)"
        if alignment and not _aten_vectorizes(x, weight):
            return _ALIGN_REASON
        return None
    m = x.numel() // max(d, 1)
    plan = _mean_plan(max(m, 1), d, num)
    return plan if isinstance(plan, str) else None


def supports_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics | None = None,
    alignment: bool = True,
) -> str | None:
    """None if ``rmsnorm`` reproduces the reference bit for bit on this input, else a short reason.
    ``alignment=False`` leaves out the per-pointer alignment (for a caller that handles
    ``NotVectorizable`` per call, as ``rmsnorm_with(..., fallback=...)`` does)."""
    return _exact_reason(x, weight, flavour, numerics or default_numerics(x), alignment)


def supports_rmsnorm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics | None = None,
    alignment: bool = True,
) -> str | None:
    """None if ``rmsnorm_modulate`` is bit-exact on this input, else a short reason (see ``supports_rmsnorm``)."""
    reason = _exact_reason(x, weight, flavour, numerics or default_numerics(x), alignment)
    return reason or _check_bcast(x, scale, "scale") or _check_bcast(x, shift, "shift")


def supports_rmsnorm_fast(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """None if ``rmsnorm_fast`` can run (approximate: ulp contract, not exact)."""
    reason = _check_common(x, weight, flavour)
    if reason is None and x.shape[-1] > _MAX_FAST_D:
        reason = f"D > {_MAX_FAST_D}"
    return reason


def supports_rmsnorm_fast_torch(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """``supports_rmsnorm_fast`` for flavour "torch" only (max 1 ulp: one registration, ulp(1))."""
    return (
        supports_rmsnorm_fast(x, weight, eps, flavour) if flavour == "torch" else "registered for flavour 'torch' only"
    )


def supports_rmsnorm_fast_diffusers(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str
) -> str | None:
    """``supports_rmsnorm_fast`` for flavour "diffusers" only (max 2 ulp: its own registration, ulp(2))."""
    if flavour != "diffusers":
        return "registered for flavour 'diffusers' only"
    return supports_rmsnorm_fast(x, weight, eps, flavour)


def supports_rmsnorm_modulate_fast(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str
) -> str | None:
    """None if ``rmsnorm_modulate_fast`` can run (approximate)."""
    reason = supports_rmsnorm_fast(x, weight, eps, flavour)
    return reason or _check_bcast(x, scale, "scale") or _check_bcast(x, shift, "shift")


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------

_NO_BCAST = (1, 0, 0, 0)


def _modulate_args(
    x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None
) -> tuple[torch.Tensor, tuple[int, int, int, int], torch.Tensor, tuple[int, int, int, int]]:
    if scale is None or shift is None:
        return x, _NO_BCAST, x, _NO_BCAST
    sc, *sc_l = _bcast_layout(scale, x.shape)
    sh, *sh_l = _bcast_layout(shift, x.shape)
    return sc, tuple(sc_l), sh, tuple(sh_l)


def _default_arrangement(flavour: str, plan: _Plan, rows_per_program: int, modulate: bool) -> int:
    """Tile arrangement measured fastest on an H200 at [32640, 4096] bf16.

    [A, R, K, B] keeps the torch flavour's folds in registers (4-element vectors); the diffusers
    modulate moves a third less through shared memory with 16-byte vectors ([A*B, R, K]), and
    the two are even for the diffusers rmsnorm. Other shapes keep the layout that was measured.
    """
    if flavour == "diffusers" and modulate and plan.vec_form and rows_per_program == 1:
        return int(ARR_MERGED)
    return int(ARR_ARKB)


def _default_rows(tile: int) -> int:
    """Rows per program: small rows are batched so a program moves at least ~4K elements."""
    return max(1, min(64, _last_pow2(max(1, 4096 // max(tile, 1)))))


def _default_warps(elems: int) -> int:
    return max(1, min(8, _next_pow2(max(1, elems // 1024))))


def _exact_schedule(
    m: int, d: int, flavour: str, num: Numerics, rows_per_program: int | None, num_warps: int | None
) -> tuple[_Plan, float, int, int]:
    """(tile plan, statistic factor, rows per program, warps) of the exact kernels for [m, d] rows
    whose ``_exact_reason`` is None (also the q/k norm + RoPE kernel's)."""
    if flavour == "torch":
        plan, factor = _torch_plan(d, num), 1.0
    else:
        plan = _mean_plan(max(m, 1), d, num)
        assert not isinstance(plan, str)
        factor = _mean_factor(max(m, 1), d)
    rows = rows_per_program or _default_rows(plan.k * plan.a * plan.b)
    # torch: one warp per 32 emulated threads, the rest of a row stays in registers (4 warps on
    # CUDA numerics); diffusers: 4 warps per 128 folds. Measured best at [32640, 4096] on an H200
    # (the plain torch-flavour norm then takes _CUDA_TORCH_TUNED in _plan_launch).
    warps = num_warps or max(1, min(8, plan.a * plan.b // (plan.b if flavour == "torch" else 1) // 32))
    return plan, factor, rows, warps


class _Launch(NamedTuple):
    """Everything about one launch that follows from the inputs' metadata (cached per metadata key)."""

    grid: tuple[int]
    m: int
    rows_view: bool  # x's rows are evenly strided: pass x itself with stride_xm; else copy (_rows_of)
    stride_xm: int
    sc_l: tuple[int, int, int, int] | None  # scale layout; None: recompute per call (needs a copy)
    sh_l: tuple[int, int, int, int] | None
    consts: tuple  # the constexpr arguments, in signature order
    options: dict
    align: int  # torch flavour: bytes x and weight must be aligned to (aten vectorizes only then)
    check_x: bool
    check_w: bool
    kernels: dict  # (device, pointer alignments) -> the kernel Triton compiled for them


_LAUNCHES: dict[tuple, _Launch] = {}
# Register cap for the RMSNorm kernels (Triton's maxnreg); None: Triton's choice. An experiment knob
# (lab/gpu/rmsnorm_cuda.py --maxnreg): set it before the first launch, or clear _LAUNCHES after.
_MAXNREG: int | None = None
_MAX_LAUNCHES = 4096
_ALIGN_REASON = "x or weight not aligned to 4 elements (aten runs its Welford kernel)"


# (rows per program, warps) of the plain torch-flavour norm on CUDA numerics, by (D, element size),
# measured on the H200 at [32640, D] bf16: two rows per 8-warp program beat one per 4 warps by 0.5-1.2
# us in four runs (lab/gpu/rmsnorm_sweep.py; lab/gpu/rmsnorm_cuda.py --hints / --maxnreg). fp16 moves the same
# bytes; fp32 rows (twice the bytes) and other D are unmeasured and keep the defaults. Not for the
# diffusers flavour (25-45% slower that way) nor the modulate kernel. SM100/SM103 inherit it untested.
_CUDA_TORCH_TUNED: dict[tuple[int, int], tuple[int, int]] = {(4096, 2): (2, 8)}

# Programmatic dependent launch for the exact kernels: None = on for CUDA devices of compute capability 9+
# (Hopper's griddepcontrol), False/True force it (an experiment knob; clear _LAUNCHES after changing it;
# True on an older GPU, under the interpreter or with Triton < 3.4 fails to compile).
# Each program waits for the previous grid before its first load, then lets the next PDL launch go, so in
# a stream of launches the next kernel's launch and ramp-up overlap this one's tail. On the H200, back-to-back
# [1,32640,4096] bf16 torch-flavour norms (2 rows per 8-warp program): 130.7-130.8 -> 129.2-129.5 us per call,
# bit-identical (lab/gpu/rmsnorm_persist.py --pdl, lab/results/h200/rmsnorm_pdl_variant.txt). A kernel launched
# without PDL after this one waits for it as usual.
_PDL: bool | None = None


@functools.lru_cache(maxsize=64)
def _pdl_capable(device_index: int) -> bool:
    """Hopper's griddepcontrol exists (CUDA, compute capability 9+) and this Triton can emit it."""
    return (
        gdc_wait is not None
        and torch.version.hip is None
        and torch.cuda.get_device_capability(device_index)[0] >= 9
    )


def _use_pdl(x: torch.Tensor) -> bool:
    if _PDL is not None:
        return _PDL
    return x.is_cuda and not _interpreting() and _pdl_capable(x.get_device())


def _meta(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _plan_launch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
    flavour: str,
    num: Numerics,
    rows_per_program: int | None,
    num_warps: int | None,
    arrangement: int | None,
    stream: bool,
    exact: bool,
    rsqrt: int | None,
    store_stat: bool,
) -> _Launch:
    d = x.shape[-1]
    m = x.numel() // max(d, 1)
    x2 = _rows_of(x)
    rows_view = x2.data_ptr() == x.data_ptr() or x.numel() == 0
    sc_l = sh_l = _NO_BCAST
    if scale is not None and shift is not None:
        sc, *sc_l = _bcast_layout(scale, x.shape)
        sh, *sh_l = _bcast_layout(shift, x.shape)
        sc_l = tuple(sc_l) if sc.data_ptr() == scale.data_ptr() else None
        sh_l = tuple(sh_l) if sh.data_ptr() == shift.data_ptr() else None
    align = check_x = check_w = 0
    pdl = exact and _use_pdl(x)
    if exact:
        tuned = flavour == "torch" and scale is None and num._replace(rsqrt=RSQRT_PTX) == CUDA_NUMERICS
        if tuned and rows_per_program is None and num_warps is None:
            rows_per_program, num_warps = _CUDA_TORCH_TUNED.get((d, x.element_size()), (None, None))
        plan, factor, r, warps = _exact_schedule(m, d, flavour, num, rows_per_program, num_warps)
        if flavour == "torch":
            align = _TORCH_VEC * x.element_size()
            check_x = x.is_contiguous()
            check_w = weight is not None and weight.is_contiguous()
        if arrangement is None:
            arrangement = _default_arrangement(flavour, plan, r, scale is not None)
        consts = (
            _f32(eps),
            factor,
            d,
            FLAVOURS.index(flavour),
            weight is not None,
            scale is not None,
            store_stat,
            r,
            plan.k,
            plan.a,
            plan.b,
            plan.vec_form,
            int(arrangement),
            stream,
            num.warp,
            plan.bw,
            plan.y,
            num.mean_shfl_increasing,
            num.mean_x_first,
            num.rsqrt,
            pdl,
        )
    else:
        block_d = _next_pow2(d)
        r = rows_per_program or _default_rows(block_d)
        warps = num_warps or _default_warps(r * block_d)
        consts = (
            _f32(eps),
            _f32(1.0 / d),
            d,
            FLAVOURS.index(flavour),
            weight is not None,
            scale is not None,
            r,
            block_d,
            default_numerics(x).rsqrt if rsqrt is None else rsqrt,
        )
    return _Launch(
        (triton.cdiv(m, r),),
        m,
        rows_view,
        x2.stride(0) if x2.dim() == 2 else d,
        sc_l,
        sh_l,
        consts,
        {
            "num_warps": warps,
            "enable_fp_fusion": False,
            **({"maxnreg": _MAXNREG} if _MAXNREG else {}),
            **({"launch_pdl": True} if pdl else {}),
        },
        align,
        bool(check_x),
        bool(check_w),
        {},
    )


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
    flavour: str,
    num: Numerics,
    rows_per_program: int | None,
    num_warps: int | None,
    stat: torch.Tensor | None,
    arrangement: int | None,
    stream: bool,
    exact: bool,
    rsqrt: int | None = None,
) -> torch.Tensor:
    # The launch plan depends on metadata only; the pointer alignments aten checks are re-read per call.
    key = (
        x.shape,
        x.stride(),
        x.dtype,
        x.device,
        weight is None or _meta(weight),
        scale is None or _meta(scale),
        shift is None or _meta(shift),
        eps,
        flavour,
        num,
        rows_per_program,
        num_warps,
        arrangement,
        stream,
        exact,
        rsqrt,
        stat is None,
    )
    lp = _LAUNCHES.get(key)
    if lp is None:
        reason = (
            _exact_reason(x, weight, flavour, num, False) if exact else supports_rmsnorm_fast(x, weight, eps, flavour)
        )
        if reason:
            raise ValueError(f"triton rmsnorm {'exact' if exact else 'fast'}: {reason}")
        lp = _plan_launch(
            x,
            weight,
            scale,
            shift,
            eps,
            flavour,
            num,
            rows_per_program,
            num_warps,
            arrangement,
            stream,
            exact,
            rsqrt,
            stat is not None,
        )
        if len(_LAUNCHES) < _MAX_LAUNCHES:
            _LAUNCHES[key] = lp
    if lp.align and ((lp.check_x and x.data_ptr() % lp.align) or (lp.check_w and weight.data_ptr() % lp.align)):
        raise NotVectorizable(f"triton rmsnorm exact: {_ALIGN_REASON}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # a third of torch.empty's host cost
    if lp.m == 0 or x.shape[-1] == 0:
        return out
    xr = x if lp.rows_view else _rows_of(x)
    sc = sh = xr
    sc_l = sh_l = _NO_BCAST
    if scale is not None and shift is not None:
        sc, sc_l = (scale, lp.sc_l) if lp.sc_l is not None else _contiguous_layout(scale, x.shape)
        sh, sh_l = (shift, lp.sh_l) if lp.sh_l is not None else _contiguous_layout(shift, x.shape)
    w = weight if weight is not None else xr
    st = stat if stat is not None else out
    if exact:
        eps32, factor, *consts = lp.consts
        tail = (lp.m, lp.stride_xm, 1, *sc_l, *sh_l, eps32, factor, *consts)
        ptrs: tuple = (xr, w, sc, sh, out, st)
        fn = _rmsnorm_exact_kernel
    else:
        eps32, inv_d, *consts = lp.consts
        tail = (lp.m, lp.stride_xm, *sc_l, *sh_l, eps32, inv_d, *consts)
        ptrs = (xr, w, sc, sh, out)
        fn = _rmsnorm_fast_kernel
    if not _DIRECT:  # the interpreter
        fn[lp.grid](*ptrs, *tail, **lp.options)
        return out
    device = xr.get_device()
    if device < 0:  # not a GPU tensor: Triton's own path gives its own error
        fn[lp.grid](*ptrs, *tail, **lp.options)
        return out
    if device != _triton_launch._current_device():  # Triton launches on the current device: go to the data
        with torch.cuda.device(device):
            fn[lp.grid](*ptrs, *tail, **lp.options)
        return out
    ints = tuple([t.data_ptr() for t in ptrs])
    # Triton specialises pointers on 16-byte alignment; everything else in the key is fixed by lp.
    key = (device, *[p & 15 == 0 for p in ints])
    kernel = lp.kernels.get(key)
    if kernel is None or hooked():
        kernel = fn[lp.grid](*ptrs, *tail, **lp.options)
        if kernel is not None:
            lp.kernels[key] = kernel
    else:
        launch_compiled(kernel, lp.grid, device, (*ints, *tail))
    return out


def _contiguous_layout(t: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    te, *lay = _bcast_layout(t, shape)
    return te, tuple(lay)


def _launch_exact(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
    flavour: str,
    num: Numerics,
    rows_per_program: int | None,
    num_warps: int | None,
    stat: torch.Tensor | None,
    arrangement: int | None = None,
    stream: bool = False,
) -> torch.Tensor:
    return _launch(
        x, weight, scale, shift, eps, flavour, num, rows_per_program, num_warps, stat, arrangement, stream, True
    )


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    numerics: Numerics | None = None,
) -> torch.Tensor:
    """RMSNorm bit-exact to the ``flavour`` reference (see module docstring).

    Launch config: ``rows_per_program`` rows per Triton program (default: short rows batched to
    ~4096 tile elements, 1 row at D = 4096 except ``_CUDA_TORCH_TUNED``) and ``num_warps`` (default 4 on
    CUDA numerics, 8 where tuned). ``numerics`` selects the PyTorch
    build whose reduction order is reproduced (default: this process's build). Raises ValueError
    where ``supports_rmsnorm`` gives a reason.
    """
    return _launch_exact(
        x, weight, None, None, eps, flavour, numerics or default_numerics(x), rows_per_program, num_warps, None
    )


def rmsnorm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    numerics: Numerics | None = None,
) -> torch.Tensor:
    """``rmsnorm(x) * (1 + scale) + shift`` in one kernel, every step rounded like eager."""
    return _launch_exact(
        x, weight, scale, shift, eps, flavour, numerics or default_numerics(x), rows_per_program, num_warps, None
    )


def rmsnorm_with(numerics: Numerics, fallback: Callable[..., torch.Tensor]):
    """``rmsnorm`` for one fixed ``numerics`` and default launch config, without the keyword layers
    (a backend's registered impl: every frame is host time on the small shapes). A call whose pointers
    aten would not vectorize returns ``fallback(x, weight, eps, flavour)`` (the op's reference: exact by
    definition), so one misaligned view neither fails the guard nor decides the impl for its key."""

    def rmsnorm_fixed(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
        try:
            return _launch(x, weight, None, None, eps, flavour, numerics, None, None, None, None, False, True)
        except NotVectorizable:
            return fallback(x, weight, eps, flavour)

    return rmsnorm_fixed


def rmsnorm_modulate_with(numerics: Numerics, fallback: Callable[..., torch.Tensor]):
    """``rmsnorm_modulate`` for one fixed ``numerics`` (see ``rmsnorm_with``)."""

    def rmsnorm_modulate_fixed(x, scale, shift, weight, eps, flavour) -> torch.Tensor:
        try:
            return _launch(x, weight, scale, shift, eps, flavour, numerics, None, None, None, None, False, True)
        except NotVectorizable:
            return fallback(x, scale, shift, weight, eps, flavour)

    return rmsnorm_modulate_fixed


def rmsnorm_stats(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str, *, numerics: Numerics | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, per-row statistic): rstd for "torch", mean of squares for "diffusers" (diagnostics)."""
    m = x.numel() // max(x.shape[-1], 1)
    stat = torch.empty(m, dtype=torch.float32, device=x.device)
    out = _launch_exact(x, weight, None, None, eps, flavour, numerics or default_numerics(x), None, None, stat)
    return out, stat


def _launch_fast(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
    flavour: str,
    rows_per_program: int | None,
    num_warps: int | None,
    rsqrt: int | None,
) -> torch.Tensor:
    return _launch(
        x,
        weight,
        scale,
        shift,
        eps,
        flavour,
        default_numerics(x),
        rows_per_program,
        num_warps,
        None,
        None,
        False,
        False,
        rsqrt,
    )


def rmsnorm_fast(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """RMSNorm with one tree-summed reduction: same roundings as the flavour, not bit-exact."""
    return _launch_fast(x, weight, None, None, eps, flavour, rows_per_program, num_warps, None)


def rmsnorm_modulate_fast(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Fused approximate ``rmsnorm_fast(x) * (1 + scale) + shift`` with eager's per-op roundings."""
    return _launch_fast(x, weight, scale, shift, eps, flavour, rows_per_program, num_warps, None)
