"""Triton device helpers that reproduce aten's fp32 reduction orders, shared by every exact kernel.

A sequential fold (a CUDA thread's loop ``acc = acc + v`` or ``fma(v, v, acc)``) is recursive halving
of the fold axis with ``tl.split``: fold the first half, then the second. A shuffle or shared-memory
tree is a ``tl.sum`` over a size-2 axis of a reshape: ``[.., 2, n/2]`` for a halving tree (offsets
n/2 .. 1), ``[.., n/2, 2]`` for adjacent pairs (offsets 1 .. n/2). Neither depends on the register
layout Triton picks, so the tile's arrangement never changes a bit. ``row_stat`` composes them into
the per-row statistic of either flavour; ``normalize`` and ``modulate`` round like eager.

Callers compile with ``enable_fp_fusion=False``: every ``a * b + c`` here is two roundings unless it
is spelled ``tl.fma`` (where nvcc contracts aten's expression).
"""

from __future__ import annotations

import triton
import triton.language as tl

from xbackend.kernels.rmsnorm import numerics

# numerics.py's codes as constexprs: @triton.jit code can read only constexpr globals.
ARR_ARKB = tl.constexpr(numerics.ARR_ARKB)
ARR_MERGED = tl.constexpr(numerics.ARR_MERGED)
RSQRT_PTX = tl.constexpr(numerics.RSQRT_PTX)
FLAVOUR_TORCH = tl.constexpr(numerics.FLAVOUR_TORCH)
MEAN_VEC = tl.constexpr(numerics.MEAN_VEC)
MAX_TREE = tl.constexpr(1024)  # widest tree: aten's blocks have at most 1024 threads
MAX_TREE_LEVELS = tl.constexpr(10)  # log2(MAX_TREE)


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
def fold(x, acc, FMA: tl.constexpr):
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
def tree(v, N: tl.constexpr, ADJACENT: tl.constexpr):
    """Reduce v [R, G, N] over its last axis like a shuffle tree over N lanes -> [R, G].

    ADJACENT=False: offsets N/2, N/4, .., 1 (lane l adds lane l + offset: a halving tree).
    ADJACENT=True: offsets 1, 2, .., N/2 (lane 0 ends with ((v0+v1)+(v2+v3))+...).
    """
    tl.static_assert(N <= MAX_TREE, "tree wider than 1024 lanes")
    for _ in tl.static_range(MAX_TREE_LEVELS):  # exhausted levels emit nothing
        if v.shape[2] > 1:
            if ADJACENT:
                v = tl.sum(tl.reshape(v, [v.shape[0], v.shape[1], v.shape[2] // 2, 2]), axis=3)
            else:
                v = tl.sum(tl.reshape(v, [v.shape[0], v.shape[1], 2, v.shape[2] // 2]), axis=2)
    return tl.reshape(v, [v.shape[0], v.shape[1]])


@triton.jit
def block_x_tree(v, BW: tl.constexpr, LANES: tl.constexpr, ADJACENT: tl.constexpr):
    """Reduce.cuh block_x_reduce over v [R, G, BW] -> [R, G]."""
    R: tl.constexpr = v.shape[0]
    G: tl.constexpr = v.shape[1]
    if BW > LANES:
        # shared-memory halving (offsets BW/2 .. LANES) over the bits above the lane index
        h = tl.permute(tl.reshape(v, [R, G, BW // LANES, LANES]), (0, 1, 3, 2))
        h = tree(tl.reshape(h, [R, G * LANES, BW // LANES]), BW // LANES, False)
        out = tree(tl.reshape(h, [R, G, LANES]), LANES, ADJACENT)
    else:
        out = tree(v, BW, ADJACENT)
    return out


@triton.jit
def rsqrt(v, MODE: tl.constexpr):
    """The build's rsqrtf (numerics.RSQRT_*)."""
    if MODE == RSQRT_PTX:
        out = tl.inline_asm_elementwise("rsqrt.approx.f32 $0, $1;", "=r,r", [v], dtype=tl.float32, is_pure=True, pack=1)
    else:
        out = tl.math.rsqrt(v)
    return out


@triton.jit
def normalize(x, rstd, w, FLAVOUR: tl.constexpr, HAS_W: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Output of rmsnorm from fp32 x, the row's rstd (broadcastable) and fp32 weight."""
    if FLAVOUR == FLAVOUR_TORCH:
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
def modulate(y, sc, sh, OUT_DTYPE: tl.constexpr):
    """Eager ``y * (1 + scale) + shift``: each op in fp32, rounded to the dtype."""
    one_plus = (sc.to(tl.float32) + 1.0).to(OUT_DTYPE)
    prod = (y.to(tl.float32) * one_plus.to(tl.float32)).to(OUT_DTYPE)
    return (prod.to(tl.float32) + sh.to(tl.float32)).to(OUT_DTYPE)


@triton.jit
def bcast_ptrs(ptr, rows, toff, koff, inner, s_outer, s_inner, s_col):
    """Pointers into a [M, D]-broadcast operand: row r -> (r // inner, r % inner), column toff + koff."""
    ro = rows // inner
    ri = rows - ro * inner
    return ptr + (ro * s_outer + ri * s_inner + toff * s_col) + koff * s_col


@triton.jit
def to_fold_order(x, ARR: tl.constexpr, R: tl.constexpr, K: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """The loaded tile as [R, A, B, K] whatever its arrangement (a pure relabeling)."""
    if ARR == ARR_ARKB:
        out = tl.permute(x, (1, 0, 3, 2))
    else:
        out = tl.permute(tl.reshape(x, [A, B, R, K]), (2, 0, 1, 3))
    return out


@triton.jit
def row_stat(
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
    DIV_POW2: tl.constexpr = False,
):
    """Per-row statistic [R] of the fp32 tile x (arranged per ARR) in the flavour's exact order:
    sum of squares / D ("torch"), mean of squares ("diffusers"); rstd is rsqrt(stat + eps)."""
    if FLAVOUR == FLAVOUR_TORCH:
        # thread a folds its vectors k = 0.. and their 4 elements, k-major: fma(x, x, acc)
        xs = tl.permute(to_fold_order(x, ARR, R, K, A, B), (0, 1, 3, 2))  # [R, A, K, B]
        acc = fold(tl.reshape(xs, [R, A, K * B]), tl.zeros([R, A], tl.float32), True)
        if A < LANES:
            # a trimmed tile (launch.Schedule.trim): the threads dropped above A held exact zeros, and
            # a halving tree's offsets >= A add only those to lanes < A: a tree over A lanes is equal
            tot = tl.reshape(tree(tl.reshape(acc, [R, 1, A]), A, False), [R])
        else:
            acc = tree(tl.reshape(acc, [R, A // LANES, LANES]), LANES, False)  # lanes, per warp
            tot = tl.reshape(tree(tl.reshape(acc, [R, 1, A // LANES]), A // LANES, False), [R])  # warps
        if DIV_POW2 and D & (D - 1) == 0:
            # tot / 2**k and tot * 2**-k are one correctly rounded result of the same real number (also
            # when it is subnormal), so the multiply is aten's division bit for bit, without div.rn's
            # ~15 instructions and slow path. Opt-in: it pays in issue-bound kernels (the q/k prelude);
            # the RMSNorm kernel at D = 4096 measured 3% slower with it on the H200.
            stat = tot * (1.0 / D)
        else:
            stat = tl.div_rn(tot, tl.full([R], D, tl.float32))
    else:
        q = x * x  # pow(2) is its own rounded kernel; fp fusion is off, so no FMA with the add below
        qs = to_fold_order(q, ARR, R, K, A, B)  # [R, A, B, K]
        if not VEC_FORM:
            qs = tl.permute(qs, (0, 2, 1, 3))  # [R, thread, accumulator, k]
        S: tl.constexpr = BW * Y
        # accumulators per thread: MEAN_VEC, fewer in a trimmed non-vectorized tile (launch.exact_schedule)
        NACC: tl.constexpr = B if VEC_FORM else A
        acc = fold(tl.reshape(qs, [R, S * NACC, K]), tl.zeros([R, S * NACC], tl.float32), False)
        acc = fold(tl.reshape(acc, [R, S, NACC]), tl.zeros([R, S], tl.float32), False)  # v0+v1+v2+v3
        acc = tl.reshape(acc, [R, Y, BW])
        if X_FIRST:
            acc = block_x_tree(acc, BW, LANES, SHFL_ADJ)
            tot = tl.reshape(tree(tl.reshape(acc, [R, 1, Y]), Y, False), [R])
        else:
            acc = tree(tl.permute(acc, (0, 2, 1)), Y, False)
            tot = tl.reshape(block_x_tree(tl.reshape(acc, [R, 1, BW]), BW, LANES, SHFL_ADJ), [R])
        stat = tot * factor
    return stat


__all__ = [
    "ARR_ARKB",
    "ARR_MERGED",
    "FLAVOUR_TORCH",
    "MEAN_VEC",
    "RSQRT_PTX",
    "bcast_ptrs",
    "block_x_tree",
    "fold",
    "modulate",
    "normalize",
    "row_stat",
    "rsqrt",
    "to_fold_order",
    "tree",
]
