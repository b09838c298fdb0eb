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

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.spans import wide
from xbackend.kernels.triton_tiles import column_fastest_tile

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Defaults (not tuned on hardware): 4096 elements, 8 warps (16 per thread: 2 x 16-byte bf16 vectors).
BLOCK = 4096
NUM_WARPS = 8


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


class _FlatPlan(NamedTuple):
    n: int
    grid: tuple[int]
    block: int
    even: bool
    wide: bool
    num_warps: int


class _RowsPlan(NamedTuple):
    rows: int
    d: int
    g_row_stride: int
    u_row_stride: int
    grid: tuple[int]
    block_r: int
    block_d: int
    wide: bool
    num_warps: int


_PLANS: dict[tuple, _FlatPlan | _RowsPlan | str] = {}
_MAX_PLANS = 4096


def _row_stride(t: torch.Tensor) -> int | None:
    """The row stride of ``t`` seen as ``[rows, D]`` with a contiguous last dim, or None if it has none."""
    d = t.shape[-1]
    try:
        v = t.view(-1, d)
    except RuntimeError:  # leading dims that do not collapse into one evenly strided row axis
        return None
    if d > 1 and v.stride(1) != 1:
        return None
    return v.stride(0) if v.shape[0] > 1 else d


def _analyze(gate: torch.Tensor, up: torch.Tensor, block: int, num_warps: int) -> _FlatPlan | _RowsPlan | str:
    if gate.dtype not in _DTYPES:
        return f"dtype {gate.dtype} (expected bf16, fp16 or fp32)"
    if up.dtype != gate.dtype:
        return f"gate and up dtypes differ ({gate.dtype}, {up.dtype})"
    if up.device != gate.device:
        return "gate and up on different devices"
    if up.shape != gate.shape:
        return "gate and up shapes differ (no broadcasting)"
    if block < 1 or block & (block - 1):
        return f"block {block} is not a power of two"
    n = gate.numel()
    if gate.is_contiguous() and up.is_contiguous():
        # Empty and 0-d tensors are contiguous: every input that reaches the row path has a last dim.
        grid = triton.cdiv(n, block)
        # The flat kernel masks by offset (offs < n): every lane's offset, the last block's too, must not wrap.
        return _FlatPlan(n, (grid,), block, n % block == 0, wide(gate, up, extra=grid * block), num_warps)
    sg, su = _row_stride(gate), _row_stride(up)
    if sg is None or su is None:
        which = "gate" if sg is None else "up"
        return f"{which} does not view as [rows, D] with a contiguous last dim (transposed, stride-0 or strided)"
    d = gate.shape[-1]
    rows = n // d if d else 0
    block_d = min(1024, triton.next_power_of_2(max(d, 1)))
    block_r = max(1, min(64, block // block_d))
    block_r = min(block_r, triton.next_power_of_2(max(rows, 1)))
    grid = (triton.cdiv(rows, block_r) * triton.cdiv(d, block_d),)
    # The row kernel masks by index (r < rows): gate and up with their row strides, the output contiguous.
    return _RowsPlan(rows, d, sg, su, grid, block_r, block_d, wide(gate, up, extra=n), num_warps)


def _plan(gate: torch.Tensor, up: torch.Tensor, block: int, num_warps: int) -> _FlatPlan | _RowsPlan | str:
    # Shapes, strides and dtypes fix the plan, so the analysis runs once per geometry.
    key = (gate.shape, gate.stride(), gate.dtype, gate.device, up.shape, up.stride(), up.dtype, up.device,
           block, num_warps)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _analyze(gate, up, block, num_warps)
        if len(_PLANS) < _MAX_PLANS:
            _PLANS[key] = plan
    return plan


def supports(gate: torch.Tensor, up: torch.Tensor) -> str | None:
    """Why the kernel cannot take these inputs, or None (sees shapes only: answers for meta tensors)."""
    plan = _plan(gate, up, BLOCK, NUM_WARPS)
    return plan if isinstance(plan, str) else None


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
