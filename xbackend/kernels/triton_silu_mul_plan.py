"""Which inputs the Triton SwiGLU kernels take and how each launches (flat or row-tiled grid, blocks,
strides), decided from shapes, strides and dtypes alone. No Triton here: ``supports`` answers where
Triton cannot be imported (a CPU host planning a simulated GPU); ``triton_silu_mul`` launches from the
same plans.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from xbackend.kernels._grid import cdiv, next_power_of_2
from xbackend.kernels.spans import wide

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Defaults (not tuned on hardware): 4096 elements, 8 warps (16 per thread: 2 x 16-byte bf16 vectors).
BLOCK = 4096
NUM_WARPS = 8


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
        grid = cdiv(n, block)
        # The flat kernel masks by offset (offs < n): every lane's offset, the last block's too, must not wrap.
        return _FlatPlan(n, (grid,), block, n % block == 0, wide(gate, up, extra=grid * block), num_warps)
    sg, su = _row_stride(gate), _row_stride(up)
    if sg is None or su is None:
        which = "gate" if sg is None else "up"
        return f"{which} does not view as [rows, D] with a contiguous last dim (transposed, stride-0 or strided)"
    d = gate.shape[-1]
    rows = n // d if d else 0
    block_d = min(1024, next_power_of_2(max(d, 1)))
    block_r = max(1, min(64, block // block_d))
    block_r = min(block_r, next_power_of_2(max(rows, 1)))
    grid = (cdiv(rows, block_r) * cdiv(d, block_d),)
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
