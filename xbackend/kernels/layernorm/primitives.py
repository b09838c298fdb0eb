"""Triton device helpers that reproduce aten's LayerNorm order (``numerics``' docstring spells it out).

A thread's Welford loop is folded one 4-element vector at a time (``welford_vector``: recursive halving
of the vector with ``tl.split``, the first half, then the second), each element knowing its step index
J at compile time: the count after it is J + 1 for every thread that has the element, and the threads
past the row's end keep their state (``tl.where``). The shuffle and shared-memory trees are halving
trees over a size-2 axis, the lower half merging the upper one into itself (``cuWelfordCombine(own,
other)``). None of it depends on Triton's register layout.

Callers compile with ``enable_fp_fusion=False``: every ``a * b + c`` here is two roundings unless it
is spelled ``tl.fma`` (where nvcc contracts aten's expression).
"""

from __future__ import annotations

import triton
import triton.language as tl

from xbackend.kernels.layernorm import numerics
from xbackend.kernels.rmsnorm.primitives import rsqrt

RCP_IEEE = tl.constexpr(numerics.RCP_IEEE)
MAX_TREE_LEVELS = tl.constexpr(10)  # log2 of the widest block aten launches (1024 threads)


@triton.jit
def recip(v, MODE: tl.constexpr):
    """The build's ``1.f / v`` (numerics.RCP_*)."""
    if MODE == RCP_IEEE:
        out = tl.div_rn(tl.full(v.shape, 1.0, tl.float32), v)  # rcp.rn.f32: the correctly rounded reciprocal
    else:
        out = tl.inline_asm_elementwise("v_rcp_f32 $0, $1", "=v,v", [v], dtype=tl.float32, is_pure=True, pack=1)
    return out


@triton.jit
def _halves(x):
    """[R, P, 2H] -> first half [R, P, H], second half [R, P, H] (along the last axis)."""
    y = tl.reshape(x, [x.shape[0], x.shape[1], 2, x.shape[2] // 2])
    return tl.split(tl.permute(y, (0, 1, 3, 2)))


@triton.jit
def _step(x, mean, m2, nvec, J: tl.constexpr, B: tl.constexpr, RECIP: tl.constexpr):
    """cuWelfordOnlineSum of element J (vector J // B) of every thread that has it; the others keep
    their state. The count after it is J + 1, so 1 / count is a constant."""
    v = tl.reshape(x, [x.shape[0], x.shape[1]])
    if RECIP == RCP_IEEE:
        rc = tl.full([1, 1], 1.0 / (J + 1), tl.float32)  # the fp32 nearest 1/(J+1), as rcp.rn.f32 rounds it
    else:
        rc = recip(tl.full([1, 1], J + 1, tl.float32), RECIP)
    delta = v - mean
    new_mean = tl.fma(delta, rc, mean)  # nvcc: mean + delta * (1.f / count)
    new_m2 = tl.fma(delta, v - new_mean, m2)  # nvcc: sigma2 + delta * (val - new_mean)
    live = nvec > J // B
    return tl.where(live, new_mean, mean), tl.where(live, new_m2, m2)


@triton.jit
def _fold2(x, mean, m2, nvec, J: tl.constexpr, B: tl.constexpr, RECIP: tl.constexpr):
    lo, hi = _halves(x)
    mean, m2 = _step(lo, mean, m2, nvec, J, B, RECIP)
    return _step(hi, mean, m2, nvec, J + 1, B, RECIP)


@triton.jit
def _fold4(x, mean, m2, nvec, J: tl.constexpr, B: tl.constexpr, RECIP: tl.constexpr):
    lo, hi = _halves(x)
    mean, m2 = _fold2(lo, mean, m2, nvec, J, B, RECIP)
    return _fold2(hi, mean, m2, nvec, J + 2, B, RECIP)


@triton.jit
def welford_vector(x, mean, m2, nvec, k: tl.constexpr, RECIP: tl.constexpr):
    """Each thread's Welford state [R, A] after its k-th vector x [R, A, B] (elements k*B .. k*B + B - 1
    of its loop), for the threads that have a k-th vector (``nvec`` [1, A]: how many each has)."""
    B: tl.constexpr = x.shape[2]
    tl.static_assert(B == 4, "aten's vec_size is 4")
    return _fold4(x, mean, m2, nvec, k * B, B, RECIP)


@triton.jit
def welford_combine(own_mean, own_m2, own_n, mean, m2, n, RECIP: tl.constexpr):
    """cuWelfordCombine(dataB=own, dataA=other) as nvcc contracts it; (0, 0, 0) for an empty pair."""
    delta = own_mean - mean
    count = n + own_n
    some = count > 0
    coef = recip(tl.where(some, count, 1.0), RECIP)
    n_a = n * coef
    n_b = own_n * coef
    out_mean = tl.fma(n_a, mean, n_b * own_mean)  # nA*dataA.mean + nB*dataB.mean: the left product fused
    out_m2 = tl.fma((delta * delta) * n, n_b, m2 + own_m2)  # (sA + sB) + ((delta*delta)*countA)*nB
    return tl.where(some, out_mean, 0.0), tl.where(some, out_m2, 0.0), count


@triton.jit
def _pair(v):
    """[R, G, L] -> (v[..., :L/2], v[..., L/2:]), each taken from a size-2 axis by an integer sum of its
    bits with zero: exact for every value (signed zeros and NaN payloads too) and, unlike ``tl.split``
    of a lane-distributed axis, a plain cross-lane reduction for the compiler."""
    y = tl.reshape(v.to(tl.int32, bitcast=True), [v.shape[0], v.shape[1], 2, v.shape[2] // 2])
    j = tl.arange(0, 2)[None, None, :, None]
    lo = tl.sum(tl.where(j == 0, y, 0), axis=2)
    hi = tl.sum(tl.where(j == 1, y, 0), axis=2)
    return lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)


@triton.jit
def welford_tree(mean, m2, n, RECIP: tl.constexpr):
    """Reduce [R, G, L] states over L like a shuffle-down tree (offsets L/2 .. 1, lane l merging lane
    l + offset into itself) or aten's shared-memory halving over warps -> [R, G]."""
    for _ in tl.static_range(MAX_TREE_LEVELS):  # exhausted levels emit nothing
        if mean.shape[2] > 1:
            lo_mean, hi_mean = _pair(mean)
            lo_m2, hi_m2 = _pair(m2)
            lo_n, hi_n = _pair(n)
            mean, m2, n = welford_combine(lo_mean, lo_m2, lo_n, hi_mean, hi_m2, hi_n, RECIP)
    R: tl.constexpr = mean.shape[0]
    G: tl.constexpr = mean.shape[1]
    return tl.reshape(mean, [R, G]), tl.reshape(m2, [R, G]), tl.reshape(n, [R, G])


@triton.jit
def vectors_per_thread(D: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """[1, A]: how many B-vectors aten's thread a reads of a D-element row (a, a + A, .. < D / B)."""
    a = tl.arange(0, A)[None, :]
    return (D // B - a + A - 1) // A


@triton.jit
def row_stats(mean, m2, nvec, eps, D: tl.constexpr, B: tl.constexpr, LANES: tl.constexpr, RSQRT: tl.constexpr,
              RECIP: tl.constexpr):  # fmt: skip
    """(mean, rstd) [R] from the threads' Welford states [R, A] in compute_stats' order: a tree over each
    warp's lanes, a tree over the warps, ``m2 / float(D)`` (IEEE division), ``rsqrt(var + eps)``."""
    R: tl.constexpr = mean.shape[0]
    A: tl.constexpr = mean.shape[1]
    tl.static_assert(A % LANES == 0, "the emulated block is whole warps")
    n = tl.zeros([R, A], tl.float32) + (nvec * B).to(tl.float32)
    mean, m2, n = welford_tree(tl.reshape(mean, [R, A // LANES, LANES]), tl.reshape(m2, [R, A // LANES, LANES]),
                               tl.reshape(n, [R, A // LANES, LANES]), RECIP)  # fmt: skip
    mean, m2, n = welford_tree(tl.reshape(mean, [R, 1, A // LANES]), tl.reshape(m2, [R, 1, A // LANES]),
                               tl.reshape(n, [R, 1, A // LANES]), RECIP)  # fmt: skip
    mean = tl.reshape(mean, [R])
    var = tl.div_rn(tl.reshape(m2, [R]), tl.full([R], D, tl.float32))
    return mean, rsqrt(var + eps, RSQRT)


@triton.jit
def affine(x, mean, rstd, w, b, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """The output before its rounding: ``gamma * (rstd * (x - mean)) + beta`` with nvcc's FMAs."""
    d = x - mean
    if HAS_W and HAS_B:
        y = tl.fma(w, rstd * d, b)
    elif HAS_W:
        y = w * (rstd * d)
    elif HAS_B:
        y = tl.fma(rstd, d, b)  # (rstd * (x - mean)) + beta
    else:
        y = rstd * d
    return y


@triton.jit
def operand_ptrs(ptr, rows, cols, inner, s_outer, s_inner, s_col, sel, s_sel):
    """Pointers into an operand broadcast to the [M, D] rows: row r -> (r // inner, r % inner), plus
    ``sel * s_sel`` (the per-token table an index selects), column ``cols * s_col``."""
    ro = rows // inner
    ri = rows - ro * inner
    return ptr + (ro * s_outer + ri * s_inner + sel * s_sel) + cols * s_col


__all__ = [
    "affine",
    "operand_ptrs",
    "recip",
    "row_stats",
    "vectors_per_thread",
    "welford_combine",
    "welford_tree",
    "welford_vector",
]
