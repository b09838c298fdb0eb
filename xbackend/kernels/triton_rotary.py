"""Triton RoPE, bit-exact to diffusers' ``apply_interleaved_rotary_emb`` (LTX-2.0) and
``apply_split_rotary_emb`` (LTX-2.3).

Eager runs eight kernels per call (neg, stack, two upcasts, two products, a sum, the downcast) and moves
fp32 intermediates of x's full size through memory; at a [1, 32640, 4096] query that is ~7 GB of traffic
for ~1.6 GB of useful bytes. This kernel reads x, cos and sin once and writes the output once.

Exact because every step is an IEEE fp32 operation in the order eager rounds it: the bf16/fp16 input is
upcast exactly, ``x * cos`` and ``rot * sin`` are each rounded to fp32 (``-x_imag * sin`` equals
``-(x_imag * sin)`` bit for bit), their sum is rounded to fp32, and the result once to x's dtype
(round-to-nearest-even). ``enable_fp_fusion=False`` keeps LLVM from contracting the product and sum
into an FMA.

The split layout (LTX-2.3, diffusers' ``apply_split_rotary_emb``): ``out = x.float() * cos`` (rounded),
then ``out[:r].addcmul_(-sin, x[r:])`` and ``out[r:].addcmul_(sin, x[:r])``. aten's CUDA addcmul with
``value == 1`` is ``std::fma(tensor1, tensor2, self)`` (``pointwise_op_impl`` in
``ATen/native/cuda/DeviceAddCmulCdiv.cuh``, torch 2.11 and 2.13: an explicit FMA, so no build flag
changes it), hence ``fma(-sin, x2, round(x1 * cos))`` and ``fma(sin, x1, round(x2 * cos))``, rounded once
to x's dtype. ``tl.fma`` spells it; everything else stays unfused.

Launch configuration: ``BLOCK_R`` rows by ``BLOCK_P`` channel pairs per program (defaults measured on
the H200 class of memory-bound kernels here: ~4K elements per program, 4 warps).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.spans import wide

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _rotary_interleaved_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    rows,
    pairs,
    stride_x,
    stride_f,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    WIDE: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_p = tl.program_id(1)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_p * (2 * BLOCK_P) + tl.arange(0, 2 * BLOCK_P)
    if WIDE:
        r = r.to(tl.int64)
    mask = (r[:, None] < rows) & (cols[None, :] < 2 * pairs)
    # Whole rows of pairs in one contiguous load each (vectorized), split into even/odd channels.
    x = tl.load(x_ptr + r[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + r[:, None] * stride_f + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + r[:, None] * stride_f + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x_e, x_o = tl.split(tl.reshape(x, (BLOCK_R, BLOCK_P, 2)))
    c_e, c_o = tl.split(tl.reshape(c, (BLOCK_R, BLOCK_P, 2)))
    s_e, s_o = tl.split(tl.reshape(s, (BLOCK_R, BLOCK_P, 2)))
    # eager: x.float() * cos + stack([-x_imag, x_real]).float() * sin, each op rounded to fp32
    out_e = x_e * c_e + (-x_o) * s_e
    out_o = x_o * c_o + x_e * s_o
    out = tl.reshape(tl.join(out_e, out_o), (BLOCK_R, 2 * BLOCK_P))
    # The output is contiguous: row stride 2 * pairs.
    tl.store(out_ptr + r[:, None] * (2 * pairs) + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_split_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    subrows,
    heads,
    t_len,
    half,
    stride_x,
    cs_b,
    cs_h,
    cs_t,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    WIDE: tl.constexpr,
):
    # A sub-row is one head of one token: x row `row`, channels [h*2r, (h+1)*2r); its cos/sin row is
    # cos[b, h, t] with row = b * t_len + t (heads == 1, t_len == rows: cos rows map to x rows directly).
    pid_r = tl.program_id(0)
    pid_p = tl.program_id(1)
    sub = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    if WIDE:
        sub = sub.to(tl.int64)
    row = sub // heads
    h = sub % heads
    xo = row * stride_x + h * (2 * half)
    fo = (row // t_len) * cs_b + h * cs_h + (row % t_len) * cs_t
    oo = sub * (2 * half)  # the output is contiguous: sub-rows back to back
    mask = (sub[:, None] < subrows) & (p[None, :] < half)
    x1 = tl.load(x_ptr + xo[:, None] + p[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + xo[:, None] + half + p[None, :], mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + fo[:, None] + p[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + fo[:, None] + p[None, :], mask=mask, other=0.0).to(tl.float32)
    # eager: out = x * cos (rounded); addcmul_ = fma(tensor1, tensor2, out) (aten's explicit std::fma)
    o1 = tl.fma(-s, x2, x1 * c)
    o2 = tl.fma(s, x1, x2 * c)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + oo[:, None] + p[None, :], o1.to(ty), mask=mask)
    tl.store(out_ptr + oo[:, None] + half + p[None, :], o2.to(ty), mask=mask)


_KERNEL = DirectLaunch(_rotary_interleaved_kernel)
_SPLIT_KERNEL = DirectLaunch(_rotary_split_kernel)


class _Plan(NamedTuple):
    rows: int
    pairs: int
    stride_x: int
    stride_f: int
    grid: tuple[int, int]
    block_r: int
    block_p: int
    wide: bool


class _SplitPlan(NamedTuple):
    subrows: int  # rows x heads
    heads: int
    t_len: int
    half: int
    stride_x: int
    cs_b: int
    cs_h: int
    cs_t: int
    grid: tuple[int, int]
    block_r: int
    block_p: int
    wide: bool


_PLANS: dict[tuple, _Plan | _SplitPlan | str] = {}
_MAX_PLANS = 4096


def row_view(t: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """t broadcast to ``shape`` as [rows, C] with unit column stride and one row stride, or None."""
    c = shape[-1]
    te = t.expand(shape)
    try:
        v = te.view(-1, c)
    except RuntimeError:
        return None
    if c > 1 and v.stride(1) != 1:
        return None
    return v


def _analyze_split(x: torch.Tensor, cos: torch.Tensor) -> _SplitPlan | str:
    half = x.shape[-1] // 2  # x's own heads (cos [..., D/2] per row of x)
    xv = row_view(x, x.shape)
    if xv is None:
        return "x rows are not evenly strided with a contiguous last dim"
    rows = xv.shape[0]
    if x.dim() != 4 and cos.dim() == 4:  # x [B, T, H*D] against cos [B, H, T, D/2]
        b, heads, t_len, r = cos.shape
        if tuple(x.shape) != (b, t_len, heads * 2 * r):
            return "x is not [B, T, H*D] for a [B, H, T, D/2] cos"
        if r > 1 and cos.stride(3) != 1:
            return "cos/sin last dim is not contiguous"
        half = r  # per head
        cs_b, cs_h, cs_t = cos.stride(0) if b > 1 else 0, cos.stride(1), cos.stride(2)
    else:
        fv = row_view(cos, (*x.shape[:-1], half))
        if fv is None:
            return "cos/sin rows do not map to x rows with one stride (broadcast over an outer dim)"
        heads, t_len, cs_b, cs_h, cs_t = 1, max(rows, 1), 0, 0, fv.stride(0)
    block_p = min(512, triton.next_power_of_2(max(half, 1)))
    block_r = max(1, min(64, 2048 // block_p))
    subrows = rows * heads
    # Every offset the kernel forms is an element of x or cos (sin has cos's shape and strides:
    # _analyze checks), or of the contiguous output.
    return _SplitPlan(subrows, heads, t_len, half, xv.stride(0), cs_b, cs_h, cs_t,
                      (triton.cdiv(subrows, block_r), triton.cdiv(half, block_p)), block_r, block_p,
                      wide(x, cos, extra=x.numel()))  # fmt: skip


def _analyze(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> _Plan | _SplitPlan | str:
    if x.dtype not in _DTYPES or cos.dtype not in _DTYPES or sin.dtype not in _DTYPES:
        return "dtypes must be bf16/fp16/fp32"
    if cos.device != x.device or sin.device != x.device:
        return "tensors on different devices"
    if x.dim() < 1 or x.shape[-1] % 2:
        return "x needs an even last dim"
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        return "cos and sin must share shape and strides"
    if layout == "split":
        return _analyze_split(x, cos)
    xv = row_view(x, x.shape)
    if xv is None:
        return "x rows are not evenly strided with a contiguous last dim"
    fv = row_view(cos, x.shape)
    if fv is None:
        return "cos/sin rows do not map to x rows with one stride (broadcast over an outer dim)"
    rows, c = xv.shape
    block_p = min(512, triton.next_power_of_2(max(c // 2, 1)))
    block_r = max(1, min(16, 2048 // block_p))
    return _Plan(rows, c // 2, xv.stride(0), fv.stride(0),
                 (triton.cdiv(rows, block_r), triton.cdiv(c // 2, block_p)), block_r, block_p,
                 wide(x, cos, sin, extra=x.numel()))  # fmt: skip


def _plan(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> _Plan | _SplitPlan | str:
    # Shapes, strides and dtypes fix the plan, so the analysis runs once per geometry.
    key = (x.shape, x.stride(), x.dtype, x.device, cos.shape, cos.stride(), cos.dtype, cos.device,
           sin.shape, sin.stride(), sin.dtype, sin.device, layout)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _analyze(x, cos, sin, layout)
        if len(_PLANS) < _MAX_PLANS:
            _PLANS[key] = plan
    return plan


def supports(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> str | None:
    """Why the kernel cannot take these inputs, or None (sees shapes only: answers for meta tensors)."""
    plan = _plan(x, cos, sin, layout)
    return plan if isinstance(plan, str) else None


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """``reference(x, cos, sin, layout)`` as one kernel, bit-identical on the same GPU."""
    plan = _plan(x, cos, sin, layout)
    if isinstance(plan, str):
        raise ValueError(f"triton rotary_embedding: {plan}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    if isinstance(plan, _SplitPlan):
        args = (x, cos, sin, out, plan.subrows, plan.heads, plan.t_len, plan.half, plan.stride_x, plan.cs_b,
                plan.cs_h, plan.cs_t, plan.block_r, plan.block_p, plan.wide)  # fmt: skip
        _SPLIT_KERNEL(plan.grid, args, num_warps=4, enable_fp_fusion=False)
        return out
    args = (x, cos, sin, out, plan.rows, plan.pairs, plan.stride_x, plan.stride_f, plan.block_r, plan.block_p,
            plan.wide)  # fmt: skip
    _KERNEL(plan.grid, args, num_warps=4, enable_fp_fusion=False)
    return out
