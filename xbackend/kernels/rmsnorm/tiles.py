"""The host-side arithmetic of the RMSNorm kernels, in plain Python: aten's thread block as a tile
(``torch_tile``, ``mean_tile``), the exact kernels' default schedule (``exact_schedule``) and how a
broadcast operand addresses the rows (``bcast_layout``).

``supports`` and the q/k norm + RoPE input analyses decide from these alone, so an impl's
``supports()`` answers where Triton cannot be imported (a CPU host planning a simulated GPU); the
kernels (``exact``, ``fast``) and their launch path (``launch``) take them from here.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch

from xbackend.kernels.rmsnorm.numerics import ARR_ARKB, ARR_MERGED, MEAN_VEC, TORCH_VEC, Numerics
from xbackend.kernels.rmsnorm.schedules import Schedule

MAX_EXACT_D = 16384  # longest fold the kernel unrolls: 128 steps (torch) / 64 steps (mean)
# Reduce.cuh setReduceConfig's constants (the same in every build this reproduces):
MEAN_MAX_THREADS = 512  # mnt_wrapper<float>::MAX_NUM_THREADS
MEAN_VECTORIZE_D = 128  # the input is vectorized from this row length on
MEAN_SPLIT_PER_WARP = 16  # warp_split_threshold = min(block_height * 16, max_values_per_thread)
MEAN_MAX_VALUES = 256  # max_values_per_thread: above it a row is split across blocks (a global reduce)
MAX_FAST_D = 32768  # one row per tile: BLOCK_D = next power of two of D

# The default exact schedule gives each Triton lane of a 32-lane warp one emulated thread ("torch":
# the rest of the row stays in registers) or one fold ("diffusers"): 4 warps for CUDA's 128-thread rows,
# measured best at [32640, 4096] bf16 on the H200. A launch choice, never the arithmetic; on CDNA a
# Triton warp is a 64-lane wavefront, so the same count holds two per lane there (unmeasured).
SCHEDULE_LANES = 32
MAX_DEFAULT_WARPS = 8
TILE_ELEMENTS = 4096  # short rows are batched until a program moves about this many elements
MAX_DEFAULT_ROWS = 64
FAST_ELEMENTS_PER_WARP = 1024


def last_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class Tile(NamedTuple):
    """Tile of the exact kernel: [K, A, B] per row, plus the emulated block shape."""

    k: int
    a: int
    b: int
    vec_form: bool
    bw: int
    y: int


@functools.lru_cache(maxsize=1024)  # pure in its ints; runs on every launch plan
def torch_tile(d: int, num: Numerics) -> Tile:
    """aten vectorized layer-norm kernel: torch_threads threads, vec_size 4, no tail (D % 4 == 0)."""
    threads = num.torch_threads
    iters = -(-(d // TORCH_VEC) // threads)
    return Tile(k=next_pow2(iters), a=threads, b=TORCH_VEC, vec_form=True, bw=threads, y=1)


def mean_config(m: int, d: int, warp: int) -> tuple[bool, int, int, int] | str:
    """Reduce.cuh setReduceConfig for a contiguous fp32 [m, d] tensor reduced over its last dim.

    Returns (vectorize_input, block_width, threads in y per row, ctas per output) or a reason.
    """
    vectorize = d >= MEAN_VECTORIZE_D  # reduction on the fastest dim, one reduce dim
    dim0 = d // MEAN_VEC if vectorize else d
    dim1 = m
    dim0_pow2 = last_pow2(dim0) if dim0 < MEAN_MAX_THREADS else MEAN_MAX_THREADS
    dim1_pow2 = last_pow2(dim1) if dim1 < MEAN_MAX_THREADS else MEAN_MAX_THREADS
    bw = min(dim0_pow2, warp)
    bh = min(dim1_pow2, MEAN_MAX_THREADS // bw)
    bw = min(dim0_pow2, MEAN_MAX_THREADS // bh)
    step_input = bw
    values_per_thread = -(-d // step_input)
    split_across_warps = values_per_thread >= min(bh * MEAN_SPLIT_PER_WARP, MEAN_MAX_VALUES)
    y = bh if split_across_warps else 1
    step_input *= y
    if split_across_warps and -(-d // step_input) >= MEAN_MAX_VALUES:
        return "the mean reduce would split rows across thread blocks (global reduce)"
    return vectorize, bw, y, 1


@functools.lru_cache(maxsize=1024)  # pure in its ints; runs on every launch plan
def mean_tile(m: int, d: int, num: Numerics) -> Tile | str:
    cfg = mean_config(m, d, num.warp)
    if isinstance(cfg, str):
        return cfg
    vectorize, bw, y, _ = cfg
    if vectorize and d % MEAN_VEC:
        return "diffusers exact needs D % 4 == 0 when D >= 128 (aten shifts misaligned rows)"
    threads = bw * y
    if vectorize:
        iters = -(-(d // MEAN_VEC) // threads)
        return Tile(k=next_pow2(iters), a=threads, b=MEAN_VEC, vec_form=True, bw=bw, y=y)
    per_thread = -(-d // threads)
    iters = -(-per_thread // MEAN_VEC)
    return Tile(k=next_pow2(iters), a=MEAN_VEC, b=threads, vec_form=False, bw=bw, y=y)


def mean_factor(m: int, d: int) -> float:
    """MeanOps factor: float(num_outputs) / numel, all in fp32 like aten."""
    return float(np.float32(m) / np.float32(m * d))


def f32(v: float) -> float:
    return float(np.float32(v))


class ExactSchedule(NamedTuple):
    tile: Tile
    factor: float  # the statistic's multiplier: 1 ("torch": divided by D in the kernel), MeanOps' factor
    rows: int
    warps: int


def bcast_layout(
    t: torch.Tensor, shape: torch.Size, copy: bool = True
) -> tuple[torch.Tensor, int, int, int, int] | None:
    """(tensor, inner, outer stride, inner stride, column stride) addressing t broadcast to shape.

    Row r of the [M, D] view maps to (r // inner) * s_outer + (r % inner) * s_inner; every listed
    broadcast form ([D], [1,..,1,D], [B,1,D], [B,L,D], [B,1,1,1,D]) needs at most two such groups.
    Other layouts: a contiguous copy of t broadcast to shape, or None when ``copy`` is False.
    """
    te = t.expand(shape)
    lead = list(zip(shape[:-1], te.stride()[:-1], strict=True))
    groups: list[list[int]] = []  # [size, stride], innermost first
    for size, stride in reversed(lead):
        if size == 1:
            continue
        if groups and stride == groups[-1][1] * groups[-1][0]:
            groups[-1][0] *= size
        else:
            groups.append([size, stride])
    m = math.prod(shape[:-1])
    if len(groups) > 2:
        if not copy:
            return None
        tc = te.contiguous()
        return tc, max(m, 1), 0, shape[-1], 1
    if not groups:
        return te, max(m, 1), 0, 0, te.stride(-1)
    inner, s_inner = groups[0]
    s_outer = groups[1][1] if len(groups) == 2 else 0
    return te, inner, s_outer, s_inner, te.stride(-1)


def meta(t: torch.Tensor | None) -> tuple | None:
    """What a launch plan depends on in a tensor: shape, strides, dtype, device."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def default_rows(tile: int) -> int:
    """Rows per program: small rows are batched so a program moves at least ~4K elements."""
    return max(1, min(MAX_DEFAULT_ROWS, last_pow2(max(1, TILE_ELEMENTS // max(tile, 1)))))


def default_fast_warps(elements: int) -> int:
    """Warps of a fast-kernel program: one per ~1024 tile elements, a power of two up to 8."""
    return max(1, min(MAX_DEFAULT_WARPS, next_pow2(max(1, elements // FAST_ELEMENTS_PER_WARP))))


def default_arrangement(flavour: str, tile: Tile, rows_per_program: int, modulate: bool) -> int:
    """Tile arrangement measured fastest on an H200 at [32640, 4096] bf16.

    [A, R, K, B] keeps the torch flavour's folds in registers (4-element vectors); the diffusers
    modulate moves a third less through shared memory with 16-byte vectors ([A*B, R, K]), and
    the two are even for the diffusers rmsnorm. Other shapes keep the layout that was measured.
    """
    if flavour == "diffusers" and modulate and tile.vec_form and rows_per_program == 1:
        return ARR_MERGED
    return ARR_ARKB


def exact_schedule(m: int, d: int, flavour: str, num: Numerics, schedule: Schedule) -> ExactSchedule:
    """The exact kernels' tile, statistic factor, rows per program and warps for [m, d] rows whose
    ``exact_reason`` is None (also the q/k norm + RoPE kernel's)."""
    if flavour == "torch":
        tile, factor = torch_tile(d, num), 1.0
        if schedule.trim and tile.k == 1 and next_pow2(d // TORCH_VEC) < tile.a:
            a = next_pow2(d // TORCH_VEC)
            tile = tile._replace(a=a, bw=a)
    else:
        found = mean_tile(max(m, 1), d, num)
        assert not isinstance(found, str)
        tile, factor = found, mean_factor(max(m, 1), d)
        if schedule.trim and not tile.vec_form and tile.k == 1 and tile.a * tile.b > d:
            # D < 128: thread b's accumulators a hold elements a*B + b, so those past ceil(D / B) hold
            # exact zeros, which aten adds last (v + 0.0 == v for the non-negative partial sums)
            tile = tile._replace(a=next_pow2(-(-d // tile.b)))
    rows = schedule.rows_per_program or default_rows(tile.k * tile.a * tile.b)
    lanes = tile.a if flavour == "torch" else tile.a * tile.b  # emulated threads / folds per row
    warps = schedule.num_warps or max(1, min(MAX_DEFAULT_WARPS, lanes // SCHEDULE_LANES))
    return ExactSchedule(tile, factor, rows, warps)


__all__ = [
    "FAST_ELEMENTS_PER_WARP",
    "MAX_DEFAULT_ROWS",
    "MAX_DEFAULT_WARPS",
    "MAX_EXACT_D",
    "MAX_FAST_D",
    "MEAN_MAX_THREADS",
    "MEAN_MAX_VALUES",
    "MEAN_SPLIT_PER_WARP",
    "MEAN_VECTORIZE_D",
    "SCHEDULE_LANES",
    "TILE_ELEMENTS",
    "ExactSchedule",
    "Tile",
    "bcast_layout",
    "default_arrangement",
    "default_fast_warps",
    "default_rows",
    "exact_schedule",
    "f32",
    "last_pow2",
    "mean_config",
    "mean_factor",
    "mean_tile",
    "meta",
    "next_pow2",
    "torch_tile",
]
