"""Triton q/k RMSNorm + RoPE (interleaved or split) in one pass, bit-exact to the two eager references composed.

One program per row (or ``R`` rows) loads that row of cos and sin once, then for q and for k: loads the
row, computes the flavour's statistic in PyTorch's exact reduction order (``rmsnorm.primitives.row_stat``,
the same code as the RMSNorm kernels), normalizes and rounds to q's dtype as eager does, and rotates
the rounded values with eager's fp32 roundings (``triton_rotary``'s arithmetic). The tile is the
RMSNorm kernel's ``[A, R, K, B]`` arrangement: row element ``(k*A + a)*B + b``.

* interleaved (LTX-2.0): the last axis holds adjacent channels, so a pair ``(2i, 2i + 1)`` is always
  inside one thread's vector (B is 4, or the emulated thread count, and even);
* split (LTX-2.3, heads of ``hd`` channels rotating their halves): when one fold step (``A*B``
  channels) holds ``G`` whole heads and a half-head is whole vectors, the A axis factors as
  ``[G, 2, hd/(2B)]`` and the size-2 axis is each head's first/second half; the rotation is
  ``fma(-sin, x2, round(x1*cos))``, ``fma(sin, x1, round(x2*cos))`` (``triton_rotary``'s split kernel).
  Moving the halves together costs a layout change through shared memory.

Compiled with ``enable_fp_fusion=False`` like both parents. Exact where both parents are: ``supports``
gives the RMSNorm kernels' reasons (odd D for the torch flavour, D > 16384, ...) and RoPE's. A
torch-flavour call whose pointers aten would not vectorize raises ``NotVectorizable`` per call
(``qk_norm_rope_with`` turns that into the reference for that call).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.rmsnorm.numerics import Numerics
from xbackend.kernels.rmsnorm.primitives import ARR_ARKB, normalize, row_stat, rsqrt
from xbackend.kernels.rmsnorm.supports import NotVectorizable, alignment_reason, aten_order_applies

# Which inputs the kernel takes and its launch plans (no Triton: triton_qk_norm_rope_plan).
from xbackend.kernels.triton_qk_norm_rope_plan import _plan
from xbackend.kernels.triton_qk_norm_rope_plan import supports as supports


@triton.jit
def pairs(t):
    """[A, R, K, B] -> (channels 2i, channels 2i + 1), each [A, R, K, B // 2]."""
    return tl.split(tl.reshape(t, [t.shape[0], t.shape[1], t.shape[2], t.shape[3] // 2, 2]))


@triton.jit
def _halves(t, G: tl.constexpr, H2: tl.constexpr):
    """[A, R, K, B] with A = G * 2 * H2 -> (first, second half of each head), each [G, H2, R, K, B]."""
    t = tl.reshape(t, [G, 2, H2, t.shape[1], t.shape[2], t.shape[3]])
    return tl.split(tl.permute(t, (0, 2, 3, 4, 5, 1)))


@triton.jit
def _unhalves(first, second):
    """Inverse of ``_halves``."""
    t = tl.permute(tl.join(first, second), (0, 5, 1, 2, 3, 4))  # [G, 2, H2, R, K, B]
    return tl.reshape(t, [t.shape[0] * 2 * t.shape[2], t.shape[3], t.shape[4], t.shape[5]])


@triton.jit
def row_tile(M, D: tl.constexpr, R: tl.constexpr, K: tl.constexpr, A: tl.constexpr, B: tl.constexpr,
             FULL: tl.constexpr = False):  # fmt: skip
    """This program's rows ``rr`` [1, R, 1, 1] (int64) and columns ``cols`` [A, 1, K, B] in the RMSNorm
    kernels' ``[A, R, K, B]`` arrangement (row element ``(k*A + a)*B + b``), with the column mask and the
    full mask; also the program id. ``FULL`` (the host knows ``M % R == 0`` and ``K*A*B == D``): both
    masks are constant true, so loads are unpredicated and need no zero fill."""
    pid = tl.program_id(0).to(tl.int64)
    rr = (pid * R + tl.arange(0, R))[None, :, None, None]
    toff = tl.arange(0, A)[:, None, None, None] * B + tl.arange(0, B)[None, None, None, :]
    cols = toff + tl.arange(0, K)[None, None, :, None] * (A * B)
    if FULL:
        cmask = tl.full([A, 1, K, B], 1, tl.int1)
        mask = tl.full([A, R, K, B], 1, tl.int1)
    else:
        cmask = cols < D
        mask = (rr < M) & cmask
    return pid, rr, cols, cmask, mask


@triton.jit
def norm_rope_rows(
    x_ptr, w_ptr, out_ptr, stride_x, rr, cols, cmask, mask, c1, c2, s1, s2, eps, factor,
    D: tl.constexpr, FLAVOUR: tl.constexpr, HAS_W: tl.constexpr, R: tl.constexpr, K: tl.constexpr,
    A: tl.constexpr, B: tl.constexpr, VEC_FORM: tl.constexpr, LANES: tl.constexpr, BW: tl.constexpr,
    Y: tl.constexpr, SHFL_ADJ: tl.constexpr, X_FIRST: tl.constexpr, RSQRT: tl.constexpr,
    SPLIT: tl.constexpr, G: tl.constexpr, H2: tl.constexpr, scale=1.0, SCALE: tl.constexpr = False,
    W_TILE: tl.constexpr = False, DIV_POW2: tl.constexpr = False,
):  # fmt: skip
    """One tile of rows: load, norm, round, (SCALE: times ``scale``, rounded), rotate, store. cos/sin come preloaded in fp32: interleaved
    ``c1, c2, s1, s2`` = (even, odd channels) of cos and of sin; split ``c1 = c2`` = cos, ``s1 = s2`` =
    sin, per half-head channel ([G, H2, R, K, B]). ``W_TILE``: load the weight through the tile's own
    [A, R, K, B] pointers (every row reads the same cached values) instead of one [A, 1, K, B] row: on
    64-wide rows Triton otherwise lays the product with the weight out in the weight's layout and
    moves the whole tile through shared memory and back, twice per tensor (sm90 PTX: 15 barriers and
    ldmatrix round trips against 7 barriers and none). ``DIV_POW2``: ``row_stat``'s multiply for a power-of-two D
    (bit-identical; for issue-bound callers)."""
    x = tl.load(x_ptr + rr * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    stat = row_stat(x, factor, D, FLAVOUR, R, K, A, B, VEC_FORM, ARR_ARKB, LANES, BW, Y, SHFL_ADJ, X_FIRST, DIV_POW2)
    rstd = rsqrt(stat + eps, RSQRT)[None, :, None, None]
    if HAS_W:
        if W_TILE:
            w = tl.load(w_ptr + (cols + rr * 0), mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        else:
            w = tl.load(w_ptr + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        w = x  # unused
    out_dtype: tl.constexpr = out_ptr.dtype.element_ty
    y = normalize(x, rstd, w, FLAVOUR, HAS_W, out_dtype).to(tl.float32)
    if SCALE:  # eager: a tensor times a Python float, in fp32, rounded to the tensor's dtype
        y = (y * scale).to(out_dtype).to(tl.float32)
    if SPLIT:
        # eager: out = x.float() * cos (rounded); addcmul_ is aten's std::fma(tensor1, tensor2, out)
        y1, y2 = _halves(y, G, H2)
        out = _unhalves(tl.fma(-s1, y2, y1 * c1), tl.fma(s1, y1, y2 * c1))
    else:
        # eager RoPE on the rounded norm: x.float() * cos + rotate(x).float() * sin, each op rounded to fp32
        y_e, y_o = pairs(y)
        out_e = y_e * c1 + (-y_o) * s1
        out_o = y_o * c2 + y_e * s2
        out = tl.reshape(tl.join(out_e, out_o), [A, R, K, B])
    tl.store(out_ptr + rr * D + cols, out.to(out_dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    M, stride_q, stride_k, f_a, f_b, f_c, f_d, eps, factor,
    D: tl.constexpr, FLAVOUR: tl.constexpr, HAS_W: tl.constexpr, R: tl.constexpr, K: tl.constexpr,
    A: tl.constexpr, B: tl.constexpr, VEC_FORM: tl.constexpr, LANES: tl.constexpr, BW: tl.constexpr,
    Y: tl.constexpr, SHFL_ADJ: tl.constexpr, X_FIRST: tl.constexpr, RSQRT: tl.constexpr,
    SPLIT: tl.constexpr, G: tl.constexpr, H2: tl.constexpr,
    WIDE: tl.constexpr,  # cos/sin span 2**31 elements or more: the head index in 64 bits (spans.py)
):  # fmt: skip
    pid, rr, cols, cmask, mask = row_tile(M, D, R, K, A, B)
    if SPLIT:
        # cos/sin [batch, head, token, j] (f_a = tokens, f_b/f_c/f_d = batch/head/token strides), read
        # in the halves' shape [G, H2, R, K, B]: head k*G + g, channel j = a2*B + b of each half.
        fr = (pid * R + tl.arange(0, R))[None, None, :, None, None]
        head = tl.arange(0, K)[None, None, None, :, None] * G + tl.arange(0, G)[:, None, None, None, None]
        if WIDE:  # rows are 64-bit already; the head index meets the head stride f_c
            head = head.to(tl.int64)
        j = tl.arange(0, H2)[None, :, None, None, None] * B + tl.arange(0, B)[None, None, None, None, :]
        fb = fr // f_a
        f_off = fb * f_b + head * f_c + (fr - fb * f_a) * f_d + j
        f_mask = (fr < M) & (head < D // (2 * H2 * B))
        c1 = tl.load(cos_ptr + f_off, mask=f_mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + f_off, mask=f_mask, other=0.0).to(tl.float32)
        c2, s2 = c1, s1
    else:
        # cos/sin broadcast to q: row r is (r // f_a) * f_b + (r % f_a) * f_c, unit column stride
        ro = rr // f_a
        f_off = ro * f_b + (rr - ro * f_a) * f_c + cols
        c1, c2 = pairs(tl.load(cos_ptr + f_off, mask=mask, other=0.0).to(tl.float32))
        s1, s2 = pairs(tl.load(sin_ptr + f_off, mask=mask, other=0.0).to(tl.float32))
    norm_rope_rows(
        q_ptr,
        wq_ptr,
        qo_ptr,
        stride_q,
        rr,
        cols,
        cmask,
        mask,
        c1,
        c2,
        s1,
        s2,
        eps,
        factor,
        D,
        FLAVOUR,
        HAS_W,
        R,
        K,
        A,
        B,
        VEC_FORM,
        LANES,
        BW,
        Y,
        SHFL_ADJ,
        X_FIRST,
        RSQRT,
        SPLIT,
        G,
        H2,
    )
    norm_rope_rows(k_ptr, wk_ptr, ko_ptr, stride_k, rr, cols, cmask, mask, c1, c2, s1, s2, eps, factor,
                    D, FLAVOUR, HAS_W, R, K, A, B, VEC_FORM, LANES, BW, Y, SHFL_ADJ, X_FIRST, RSQRT,
                    SPLIT, G, H2)  # fmt: skip


_KERNEL = DirectLaunch(_qk_norm_rope_kernel)


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps=1e-6, flavour="torch", layout="interleaved", *,
                 numerics: Numerics, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``reference(...)`` of ``xbackend.ops.qk_norm_rope`` as one kernel, bit-identical on the same GPU.
    Raises ValueError where ``supports`` gives a reason, ``NotVectorizable`` for a misaligned
    torch-flavour call."""
    plan = _plan(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, numerics, num_warps)
    if isinstance(plan, str):
        raise ValueError(f"triton qk_norm_rope: {plan}")
    if plan.check_alignment and not (aten_order_applies(q, q_weight, flavour) and aten_order_applies(k, k_weight, flavour)):
        raise NotVectorizable(f"triton qk_norm_rope: {alignment_reason(flavour)}")
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    if plan.rows == 0 or q.shape[-1] == 0:
        return q_out, k_out
    eps32, factor, *consts = plan.consts
    wq = q_weight if q_weight is not None else q
    wk = k_weight if k_weight is not None else k
    _KERNEL(plan.grid, (q, k, wq, wk, cos, sin, q_out, k_out, plan.rows, plan.stride_q, plan.stride_k, *plan.f_layout,
                        eps32, factor, *consts), num_warps=plan.num_warps, enable_fp_fusion=False)  # fmt: skip
    return q_out, k_out


def qk_norm_rope_with(numerics: Numerics, fallback: Callable[..., tuple[torch.Tensor, torch.Tensor]]):
    """``qk_norm_rope`` for one fixed ``numerics`` (a backend's registered impl). A call whose pointers aten
    would not vectorize returns ``fallback(...)`` (the op's reference) for that call."""

    def qk_norm_rope_fixed(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout):
        try:
            return qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, numerics=numerics)
        except NotVectorizable:
            return fallback(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout)

    return qk_norm_rope_fixed
