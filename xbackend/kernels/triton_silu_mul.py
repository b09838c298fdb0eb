"""Triton SwiGLU glue: ``out = silu(gate) * up`` rounded exactly like eager PyTorch.

Eager runs two kernels. aten's CUDA silu (``ActivationSiluKernel.cu``) is, in fp32 opmath,
``x / (1 + c10::cuda::compat::exp(-x))`` with ``compat::exp(float)`` = ``::expf``, compiled without
fast math: libdevice's ``__nv_expf``, IEEE division (``div.rn.f32``); the result is rounded to the
gate's dtype. Then ``silu * up`` upcasts both to fp32, multiplies once and rounds. This kernel does the
same steps, in one pass over gate and up:

- ``-x``: exact. ``libdevice.exp`` is ``__nv_expf`` on CUDA (``__ocml_exp_f32`` on ROCm, the function
  HIP's ``expf`` calls), never ``tl.exp`` (``ex2.approx`` of ``x * log2e``: not eager's exp).
- ``1 + e``: one fp32 rounding. ``__nv_expf`` ends in ``ex2.approx(r) * 2**k``; nvcc (``--fmad=true``)
  may contract that product with aten's ``+ 1`` into an FMA, Triton (``enable_fp_fusion=False``) does
  not. Both give the same bits: multiplying by a power of two is exact unless the product is
  subnormal, and then ``1 + e`` rounds to 1 either way.
- Triton links libdevice with ``__CUDA_FTZ=1`` (aten without): the FTZ and non-FTZ paths of
  ``__nv_expf`` differ only on subnormal inputs (``exp`` gives 1.0 for both) and subnormal results
  (``1 + e`` rounds to 1 for both), so the sum is the same.
- ``x / (1 + e)``: ``tl.div_rn`` (``div.rn.f32``; Triton's ``/`` is the approximate ``div.full.f32``).
- the silu rounded to the gate's dtype (round to nearest even), upcast, times ``up`` in fp32, rounded
  once more: eager's ``silu(gate) * up`` (for fp32 inputs both roundings are no-ops). LLVM narrows
  that product to a native ``mul.rn.bf16x2`` / ``f16x2``: the same bits, because the fp32 product of
  two 8- or 11-bit significands is exact, and rounding it through fp32 first changes no bf16 result
  in the subnormal range either (every product significand checked).

Layouts: contiguous gate and up run a flat 1-D grid of ``BLOCK`` elements per program (no masks when
``BLOCK`` divides the element count). Inputs that view as ``[rows, D]`` with a contiguous last dim and
one row stride each (padded rows; gate and up as the two halves of one fused projection) run a row-
tiled grid. Other layouts (transposed, stride-0, last-dim strided) are reported by ``supports``.
Offsets are 64-bit where an index can reach 2**31.

Triton's interpreter cannot call libdevice: under ``TRITON_INTERPRET=1`` the kernel uses ``tl.exp``
(numpy's exp), so CPU runs check the rounding structure, not bit-identity with CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from xbackend.kernels._triton_launch import DirectLaunch

# Which inputs the kernels take and their launch plans (no Triton: triton_silu_mul_plan).
from xbackend.kernels.triton_silu_mul_plan import BLOCK, NUM_WARPS, _FlatPlan, _plan
from xbackend.kernels.triton_silu_mul_plan import _RowsPlan as _RowsPlan
from xbackend.kernels.triton_silu_mul_plan import supports as supports
from xbackend.kernels.triton_tiles import column_fastest_tile


@triton.jit
def _silu_mul(g, u, LIBDEVICE: tl.constexpr):
    x = g.to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-x)
    else:  # the interpreter only (numpy's exp)
        e = tl.exp(-x)
    s = tl.div_rn(x, 1.0 + e).to(g.dtype)  # eager's silu, rounded to the gate's dtype
    return (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype)


@triton.jit
def _silu_mul_flat_kernel(
    g_ptr,
    u_ptr,
    out_ptr,
    n,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
    WIDE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        g = tl.load(g_ptr + offs)
        u = tl.load(u_ptr + offs)
        tl.store(out_ptr + offs, _silu_mul(g, u, LIBDEVICE))
    else:
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, _silu_mul(g, u, LIBDEVICE), mask=mask)


@triton.jit
def _silu_mul_rows_kernel(
    g_ptr,
    u_ptr,
    out_ptr,
    rows,
    d,
    g_row_stride,
    u_row_stride,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    _, r, c = column_fastest_tile(d, BLOCK_R, BLOCK_D, WIDE)
    mask = (r[:, None] < rows) & (c[None, :] < d)
    g = tl.load(g_ptr + r[:, None] * g_row_stride + c[None, :], mask=mask, other=0.0)
    u = tl.load(u_ptr + r[:, None] * u_row_stride + c[None, :], mask=mask, other=0.0)
    # The output is contiguous: row stride d.
    tl.store(out_ptr + r[:, None] * d + c[None, :], _silu_mul(g, u, LIBDEVICE), mask=mask)


_FLAT = DirectLaunch(_silu_mul_flat_kernel)
_ROWS = DirectLaunch(_silu_mul_rows_kernel)
# Under TRITON_INTERPRET=1 @triton.jit hands out InterpretedFunction objects, which cannot call libdevice.
_LIBDEVICE = type(_silu_mul_flat_kernel).__name__ != "InterpretedFunction"


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, block: int = BLOCK, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``F.silu(gate) * up`` as one kernel and a new contiguous tensor, bit-identical to eager on the same GPU.

    ``block``: elements per program (a power of two); ``num_warps``: warps per program.
    """
    plan = _plan(gate, up, block, num_warps)
    if isinstance(plan, str):
        raise ValueError(f"triton silu_mul: {plan}")
    out = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    if isinstance(plan, _FlatPlan):
        args = (gate, up, out, plan.n, plan.block, plan.even, plan.wide, _LIBDEVICE)
        _FLAT(plan.grid, args, num_warps=plan.num_warps, enable_fp_fusion=False)
        return out
    args = (gate, up, out, plan.rows, plan.d, plan.g_row_stride, plan.u_row_stride, plan.block_r, plan.block_d,
            plan.wide, _LIBDEVICE)  # fmt: skip
    _ROWS(plan.grid, args, num_warps=plan.num_warps, enable_fp_fusion=False)
    return out
