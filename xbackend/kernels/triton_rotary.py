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

import torch
import triton
import triton.language as tl

from xbackend.kernels._triton_launch import DirectLaunch

# Which inputs the kernels take and their launch plans (no Triton: triton_rotary_plan).
from xbackend.kernels.triton_rotary_plan import _plan, _SplitPlan
from xbackend.kernels.triton_rotary_plan import supports as supports


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
