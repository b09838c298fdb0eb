"""Tile indexing shared by the 2-D elementwise Triton kernels (gated residual, silu_mul's row path)."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["column_fastest_tile"]


@triton.jit
def column_fastest_tile(d, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, WIDE: tl.constexpr):
    """``(row0, r, c)`` of this program's ``BLOCK_R x BLOCK_D`` tile of a ``[rows, d]`` problem on a
    linear grid with column blocks fastest: consecutive programs touch consecutive memory, which
    streams measurably better from HBM than sweeping one column block down all rows first. ``WIDE``:
    row indices in 64 bits (offsets of 2**31 elements or more)."""
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(d, BLOCK_D)
    pid_r = pid // col_blocks
    pid_d = pid % col_blocks
    if WIDE:
        pid_r = pid_r.to(tl.int64)
    row0 = pid_r * BLOCK_R
    return row0, row0 + tl.arange(0, BLOCK_R), pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
