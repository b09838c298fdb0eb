"""Which inputs the Triton RoPE kernels take and how each launches (grid, tiles, strides), decided
from shapes, strides and dtypes alone. No Triton here: ``supports`` answers where Triton cannot be
imported (a CPU host planning a simulated GPU); ``triton_rotary`` launches from the same plans.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from xbackend.kernels._grid import cdiv, next_power_of_2
from xbackend.kernels.spans import wide

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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
    block_p = min(512, next_power_of_2(max(half, 1)))
    block_r = max(1, min(64, 2048 // block_p))
    subrows = rows * heads
    # Every offset the kernel forms is an element of x or cos (sin has cos's shape and strides:
    # _analyze checks), or of the contiguous output.
    return _SplitPlan(subrows, heads, t_len, half, xv.stride(0), cs_b, cs_h, cs_t,
                      (cdiv(subrows, block_r), cdiv(half, block_p)), block_r, block_p,
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
    block_p = min(512, next_power_of_2(max(c // 2, 1)))
    block_r = max(1, min(16, 2048 // block_p))
    return _Plan(rows, c // 2, xv.stride(0), fv.stride(0),
                 (cdiv(rows, block_r), cdiv(c // 2, block_p)), block_r, block_p,
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
