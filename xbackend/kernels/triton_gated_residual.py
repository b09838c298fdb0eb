"""Triton gated residual: ``out = x + update * gate`` rounded exactly like eager PyTorch.

Eager computes ``round(update * gate)`` in the dtype, then ``round(x + that)``, each product and sum
in fp32. The kernel does the same two roundings and is compiled with ``enable_fp_fusion=False``:
for fp32 inputs an FMA would skip the product's rounding and differ from eager in the last bit. A
float32 gate under a bf16/fp16 x promotes: product and sum in fp32, one rounding to x's dtype.

Work is tiled ``BLOCK_R`` rows by ``BLOCK_D`` columns. When every row of a tile maps to one gate row
(``[B,1,D]``, ``[1,..,1,D]``), the gate vector is loaded once per tile and broadcast over its rows;
a per-token gate (``[B,L,1]``) costs one scalar load per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from xbackend.kernels._gated_residual_layout import GateLayout, analyze
from xbackend.kernels._gated_residual_layout import supports as supports  # no Triton: what impls register
from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.spans import wide
from xbackend.kernels.triton_tiles import column_fastest_tile

# How a tile finds its gate rows (the GATE_ROWS constexpr).
_GATE_PER_TILE = 0  # all rows of a tile share one gate row: load it once
_GATE_PER_ROW = 1  # gate row == x row (full gate): no division
_GATE_DIVIDE = 2  # gate row == x row // inner, may change inside a tile


@triton.jit
def _gated_residual_kernel(
    x_ptr,
    u_ptr,
    g_ptr,
    out_ptr,
    rows,
    d,
    inner,
    g_row_stride,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PER_TOKEN: tl.constexpr,
    GATE_ROWS: tl.constexpr,
    EVEN: tl.constexpr,
    WIDE: tl.constexpr,
):
    row0, r, c = column_fastest_tile(d, BLOCK_R, BLOCK_D, WIDE)
    offs = r[:, None] * d + c[None, :]
    mask_r = r < rows
    mask_c = c < d
    if EVEN:
        mask = None
        mask_r = None
        mask_c = None
    else:
        mask = mask_r[:, None] & mask_c[None, :]

    x = tl.load(x_ptr + offs, mask=mask)
    u = tl.load(u_ptr + offs, mask=mask)
    if PER_TOKEN:
        if GATE_ROWS == 0:
            g = tl.load(g_ptr + (row0 // inner) * g_row_stride)
        else:
            if GATE_ROWS == 1:
                gr = r
            else:
                gr = r // inner
            g = tl.load(g_ptr + gr * g_row_stride, mask=mask_r)[:, None]
    else:
        if GATE_ROWS == 0:
            g = tl.load(g_ptr + (row0 // inner) * g_row_stride + c, mask=mask_c)[None, :]
        else:
            if GATE_ROWS == 1:
                gr = r
            else:
                gr = r // inner
            g = tl.load(g_ptr + gr[:, None] * g_row_stride + c[None, :], mask=mask)

    # Eager's roundings: the product and the sum each to the promoted dtype, which is the gate's (x's own,
    # or float32 under a half x), then the sum once to x's dtype (no-ops where they coincide).
    promoted: tl.constexpr = g_ptr.dtype.element_ty
    prod = (u.to(tl.float32) * g.to(tl.float32)).to(promoted)
    out = (x.to(tl.float32) + prod.to(tl.float32)).to(promoted).to(x.dtype)
    tl.store(out_ptr + offs, out, mask=mask)


_KERNEL = DirectLaunch(_gated_residual_kernel)


def default_block_d(d: int) -> int:
    """Widest power-of-two column block (256..1024) that tiles D without a ragged tail."""
    for block in (1024, 512, 256):
        if d % block == 0:
            return block
    return min(triton.next_power_of_2(d), 1024)


def _gate_rows_mode(layout: GateLayout, block_rows: int) -> int:
    if layout.inner % block_rows == 0 or layout.inner >= layout.rows:
        return _GATE_PER_TILE
    if layout.inner == 1:
        return _GATE_PER_ROW
    return _GATE_DIVIDE


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything a launch needs besides the tensors, derived once per input geometry."""

    layout: GateLayout
    grid: tuple[int]
    meta: dict[str, int | bool]


_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096


def _plan(
    x: torch.Tensor,
    update: torch.Tensor,
    gate: torch.Tensor,
    block_d: int | None,
    block_rows: int | None,
    num_warps: int,
) -> _Plan:
    # Shapes and strides fix the layout (contiguity included), so the analysis, which costs more
    # host time than the launch itself on small tensors, runs once per geometry.
    key = (x.shape, x.stride(), update.shape, update.stride(), gate.shape, gate.stride(),
           x.dtype, update.dtype, gate.dtype, block_d, block_rows, num_warps)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    layout = analyze(x, update, gate)
    if isinstance(layout, str):
        raise ValueError(f"triton gated_residual: {layout}")
    rows, d = layout.rows, layout.d
    bd = block_d or default_block_d(max(d, 1))
    br = block_rows or max(1, min(16, 4096 // bd))
    br = min(br, triton.next_power_of_2(max(rows, 1)))
    meta = {
        "BLOCK_R": br,
        "BLOCK_D": bd,
        "PER_TOKEN": layout.per_token,
        "GATE_ROWS": _gate_rows_mode(layout, br),
        "EVEN": rows % br == 0 and d % bd == 0,
        # x, update and the output are contiguous [rows, d]; the gate's rows sit gate_row_stride apart
        "WIDE": wide(x, update, gate, extra=rows * d),
        "num_warps": num_warps,
    }
    plan = _Plan(layout, (triton.cdiv(rows, br) * triton.cdiv(d, bd),), meta)
    if len(_PLANS) < _MAX_PLANS:
        _PLANS[key] = plan
    return plan


def _launch(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, plan: _Plan) -> tuple[torch.Tensor, object]:
    """Launch and also return Triton's compiled-kernel handle (its ``asm`` holds the PTX)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out, None
    lay = plan.layout
    meta = plan.meta
    args = (x, update, gate, out, lay.rows, lay.d, lay.inner, lay.gate_row_stride, meta["BLOCK_R"], meta["BLOCK_D"],
            meta["PER_TOKEN"], meta["GATE_ROWS"], meta["EVEN"], meta["WIDE"])
    handle = _KERNEL(plan.grid, args, num_warps=meta["num_warps"], enable_fp_fusion=False)
    return out, handle


def gated_residual(
    x: torch.Tensor,
    update: torch.Tensor,
    gate: torch.Tensor,
    *,
    block_d: int | None = None,
    block_rows: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """``x + update * gate`` as a new tensor, bit-identical to eager on the same GPU.

    ``block_d`` (power of two) columns and ``block_rows`` rows per program; None picks them from D.
    """
    if update.device != x.device or gate.device != x.device:
        raise ValueError("triton gated_residual: tensors on different devices")
    return _launch(x, update, gate, _plan(x, update, gate, block_d, block_rows, num_warps))[0]
