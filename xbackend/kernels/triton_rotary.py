"""Triton interleaved RoPE, bit-exact to diffusers' ``apply_interleaved_rotary_emb`` (LTX-2.0).

Eager runs eight kernels per call (neg, stack, two upcasts, two products, a sum, the downcast) and moves
fp32 intermediates of x's full size through memory; at a [1, 32640, 4096] query that is ~7 GB of traffic
for ~1.6 GB of useful bytes. This kernel reads x, cos and sin once and writes the output once.

Exact because every step is an IEEE fp32 operation in the order eager rounds it: the bf16/fp16 input is
upcast exactly, ``x * cos`` and ``rot * sin`` are each rounded to fp32 (``-x_imag * sin`` equals
``-(x_imag * sin)`` bit for bit), their sum is rounded to fp32, and the result once to x's dtype
(round-to-nearest-even). ``enable_fp_fusion=False`` keeps LLVM from contracting the product and sum
into an FMA. The split layout (LTX-2.3) is not here: its ``addcmul_`` rounds as aten's CUDA kernel
contracts it, which has not been derived (``supports`` says so and the reference runs).

Launch configuration: ``BLOCK_R`` rows by ``BLOCK_P`` channel pairs per program (defaults measured on
the H200 class of memory-bound kernels here: ~4K elements per program, 4 warps).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from xbackend.kernels._triton_launch import DirectLaunch

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT32_LIMIT = 2**31


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


_KERNEL = DirectLaunch(_rotary_interleaved_kernel)


class _Plan(NamedTuple):
    rows: int
    pairs: int
    stride_x: int
    stride_f: int
    grid: tuple[int, int]
    block_r: int
    block_p: int
    wide: bool


_PLANS: dict[tuple, _Plan | str] = {}
_MAX_PLANS = 4096


def _row_view(t: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
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


def _analyze(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> _Plan | str:
    if layout != "interleaved":
        return "split layout: not implemented in Triton (aten's addcmul_ contraction not derived)"
    if x.dtype not in _DTYPES or cos.dtype not in _DTYPES or sin.dtype not in _DTYPES:
        return "dtypes must be bf16/fp16/fp32"
    if cos.device != x.device or sin.device != x.device:
        return "tensors on different devices"
    if x.dim() < 1 or x.shape[-1] % 2:
        return "x needs an even last dim"
    if cos.shape != sin.shape or cos.stride() != sin.stride():
        return "cos and sin must share shape and strides"
    xv = _row_view(x, x.shape)
    if xv is None:
        return "x rows are not evenly strided with a contiguous last dim"
    fv = _row_view(cos, x.shape)
    if fv is None:
        return "cos/sin rows do not map to x rows with one stride (broadcast over an outer dim)"
    rows, c = xv.shape
    block_p = min(512, triton.next_power_of_2(max(c // 2, 1)))
    block_r = max(1, min(16, 2048 // block_p))
    span = max(rows * max(xv.stride(0), c), rows * max(fv.stride(0), c))
    return _Plan(rows, c // 2, xv.stride(0), fv.stride(0),
                 (triton.cdiv(rows, block_r), triton.cdiv(c // 2, block_p)), block_r, block_p,
                 span >= _INT32_LIMIT)  # fmt: skip


def _plan(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> _Plan | str:
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
    """``reference(x, cos, sin, "interleaved")`` as one kernel, bit-identical on the same GPU."""
    plan = _plan(x, cos, sin, layout)
    if isinstance(plan, str):
        raise ValueError(f"triton rotary_embedding: {plan}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    args = (x, cos, sin, out, plan.rows, plan.pairs, plan.stride_x, plan.stride_f, plan.block_r, plan.block_p,
            plan.wide)  # fmt: skip
    _KERNEL(plan.grid, args, num_warps=4, enable_fp_fusion=False)
    return out
